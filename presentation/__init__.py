"""Packing Lab's presentation: the figures, tables and sentences that show the engine's numbers (`demo_core`
returns numbers and draws nothing). Used by the page (`app.py`, `serving/`) and the CLI's printed report.

- `report`: the results table's columns (page, CSV, CLI), flags in words, the time anatomy's words, the history
  rows, the before-training cost table, the CLI's printed report;
- `headline`: the run at a glance at the top of the page (three big numbers per packed collator) and, folded under
  it, each collator's numbers in words with why they look that way;
- `plots`: matplotlib figures of a preview and a run (lengths, throughput, loss, memory, time anatomy);
- `batch_picture`: the page's main picture, the first batch under each collator and its attention masks.

Import the modules themselves (`from presentation import plots`): nothing is imported here, so the CLI's report does
not load matplotlib (training needs none: a GPU box carries only what training needs).
"""
