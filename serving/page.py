"""How the page looks and behaves in a browser, apart from its widgets: theme, CSS and JavaScript.

- `THEME`: Gradio's Soft theme with system fonts (the page loads without internet) and every text dark enough to
  read (WCAG AA: a contrast of at least 4.5:1; Soft's grey hints are 2.5:1, its white on indigo 4.47:1);
- `page.css`: the sticky action bar, the phone layout, tables whose numbers do not break, the collator swatches;
- `page.js`: gives each plot's image the alt text of its plot (Gradio 6.31 writes "undefined plot visualising
  provided data" for a matplotlib figure);
- `WITH_PICTURE_WIDTH`: an event's `js` that puts the width the batch picture is shown at into the event's last
  input, so that the server draws the figures for it (`figure_width_in`): their text then reads the same on a
  desktop and a phone.
"""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from presentation import batch_picture, plots

HERE = Path(__file__).parent
CSS_PATH = HERE / "page.css"
JS = (HERE / "page.js").read_text()

WITH_PICTURE_WIDTH = ("(...values) => [...values.slice(0, -1), "
                      "document.getElementById('batch-plot')?.clientWidth ?? window.innerWidth]")

# Page fonts from the system, not Google Fonts: the page must load without internet.
THEME = gr.themes.Soft(font=["ui-sans-serif", "system-ui", "sans-serif"],
                       font_mono=["ui-monospace", "SFMono-Regular", "monospace"]).set(
    block_info_text_color="*neutral_600", block_info_text_color_dark="*neutral_300",
    body_text_color_subdued="*neutral_600", body_text_color_subdued_dark="*neutral_300",
    block_label_text_color="*primary_700", block_title_text_color="*primary_700",
    button_primary_background_fill="*primary_600", button_primary_background_fill_hover="*primary_700",
    checkbox_label_background_fill_selected="*primary_600")


def figure_width_in(picture_px: float | None, widest_in: float = batch_picture.BATCH_MAX_IN) -> float:
    """A figure's width in inches, given the CSS pixels the batch picture is shown at: the picture's own width (its
    text then reads at about its size in points), capped at `widest_in` for the figures that share a row on a
    desktop; the widest when the browser did not say."""
    return min(widest_in, picture_px / plots.FIGURE_DPI) if picture_px else widest_in
