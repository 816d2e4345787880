"""test_lists package."""
