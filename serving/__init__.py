"""What serving the engine to many visitors at once needs, and the page's parts, kept out of its wiring (`app.py`):

- `errors`: every exception a handler raises reaches the visitor as one readable `gr.Error`;
- `in_flight`: the requests being served right now, for background work that waits for an idle server;
- `inputs`: a visitor's inputs turned into a prepared run (local paths only under the allowed roots);
- `sessions`: a visitor (a browser tab or an API client) as the server's files know it: an opaque key, its Stop;
- `uploads`: a visitor's uploaded file: used under its name only, deleted after the run that used it;
- `history_view`: the history as one visitor sees it: what they may list, redraw and delete;
- `downloads`: a run's JSON and CSV files;
- `gpu`: the part of a run that needs the GPU, shaped for ZeroGPU's forked worker process and its time limit;
- `runs`: a run from the server's side: its time plan, the GPU part, what is saved and what is deleted;
- `layout`: the page's widgets, in page order; `widgets`: a widget per declared setting (demo_core/settings.py);
  `page`: its theme, CSS and JavaScript (sticky action bar, phone layout, contrast, plot alt text);
- `views`: a preview's and a run's figures and tables, drawn for the width the browser shows them at;
- `provenance`: which settings or run each section of the page shows, in one line over it;
- `api_docs`: names, types and descriptions of the API endpoints' parameters (derived from the declared settings)
  and returns;
- `planner_page`: the "Will it fit, and how fast?" section and its `/plan` endpoint (the memory planner and the
  step-time model, no training).
"""
