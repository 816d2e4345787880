"""The farm, installed under one name: ``edgefarm.<package>`` is the repository's ``<package>/`` folder.

The repository keeps the design's layout (``flows/``, ``tasks/``, ``results/`` ... at its top, each folder one
package); ``edgefarm/`` holds a link to each of them, so an installed farm puts one top-level name into
site-packages (``edgefarm``, beside the ``edgellm`` library it drives) and every import reads
``from edgefarm.flows import ...``. README's "Layout" table says which folder is which package.
"""
