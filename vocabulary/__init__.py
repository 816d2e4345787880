"""The farm's shared vocabulary: plain names every layer speaks (the variant of a row, a model's shape, an engine's
route, a result's status). It imports only the standard library and ``edgellm``, so every package may use it and it
uses nothing of the farm (``tests/test_import_graph.py`` holds it to that).
"""
