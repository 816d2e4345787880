"""The published pages: the support matrix, run and list pages, the Edge-LLM layouts and the comparisons, rendered
from typed rows that results/ reads (no SQL here)."""
