"""How the page looks and behaves in a browser, apart from its widgets: theme, CSS and JavaScript.

- `THEME`: Gradio's Soft theme with system fonts (the page loads without internet) and every text dark enough to
  read (WCAG AA: a contrast of at least 4.5:1; Soft's grey hints are 2.5:1, its white on indigo 4.47:1);
- `page.css`: the sticky action bar, the phone layout, tables whose numbers do not break, the collator swatches;
- `page.js`: gives each plot's image the alt text of its plot (Gradio 6.31 writes "undefined plot visualising
  provided data" for a matplotlib figure);
- `ASK_OR_RUN`, `RUN_ANYWAY`, `CANCEL_RUN`: Run's click and the answers to the question it asks before a long or
  refused run;
- `TO_HEADLINE`: the start's `js`, which scrolls a phone to the headline;
- `WITH_SCREEN`: an event's `js` that puts the screen its figures are shown on into the event's last input (the
  width the batch picture is shown at and the device pixels per CSS pixel), so that the server draws each figure
  for it (`Screen`): its text then reads the same on a desktop and a phone, and it is sharp on a phone's or a
  retina laptop's 2-3 device pixels per CSS pixel.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import gradio as gr

from presentation import batch_picture, plots

HERE = Path(__file__).parent
CSS_PATH = HERE / "page.css"
JS = (HERE / "page.js").read_text()

WITH_SCREEN = ("(...values) => [...values.slice(0, -1), {picture_px: document.getElementById('batch-plot')"
               "?.clientWidth ?? window.innerWidth, pixel_ratio: window.devicePixelRatio || 1}]")

# Run's `js`: a phone shows the settings above the results, so Run takes the visitor down to the headline, where the
# results appear (page.css keeps it clear of the sticky action bar); a desktop that shows it already stays put.
TO_HEADLINE = """() => {
  const headline = document.getElementById('headline');
  const top = headline ? headline.getBoundingClientRect().top : 0;
  if (headline && (top < 0 || top > window.innerHeight / 2)) headline.scrollIntoView({block: 'start'});
  return [];
}"""

# Run's click, in the browser: a run whose preview warns (it would be long, or refused for its memory: the bar's
# hidden question, serving/layout.py `action_bar`) opens the question under the bar; any other starts at once. The
# run starts from the hidden start button, which "Run anyway" clicks too; Cancel, or Escape, closes the question.
ASK_OR_RUN = """() => {
  const bar = document.getElementById('action-bar');
  // The question's own words: its block also holds Gradio's status ("Error" after a preview that failed).
  if (document.querySelector('#confirm-text [data-testid="markdown"]')?.textContent.trim()) {
    bar.classList.add('asking');
    document.querySelector('#run-anyway')?.focus();
  } else {
    document.getElementById('start-run').click();
  }
  return [];
}"""
RUN_ANYWAY = """() => {
  document.getElementById('action-bar').classList.remove('asking');
  document.getElementById('start-run').click();
  return [];
}"""
CANCEL_RUN = """() => {
  document.getElementById('action-bar').classList.remove('asking');
  document.getElementById('run')?.focus();
  return [];
}"""

# Page fonts from the system, not Google Fonts: the page must load without internet.
THEME = gr.themes.Soft(font=["ui-sans-serif", "system-ui", "sans-serif"],
                       font_mono=["ui-monospace", "SFMono-Regular", "monospace"]).set(
    block_info_text_color="*neutral_600", block_info_text_color_dark="*neutral_300",
    body_text_color_subdued="*neutral_600", body_text_color_subdued_dark="*neutral_300",
    block_label_text_color="*primary_700", block_title_text_color="*primary_700",
    button_primary_background_fill="*primary_600", button_primary_background_fill_hover="*primary_700",
    checkbox_label_background_fill_selected="*primary_600")


# Device pixels per CSS pixel drawn at most: phones have 2-3; beyond 3 the eye sees no difference, the encoding does.
MAX_PIXEL_RATIO = 3.0
GAP_PX = 16  # Gradio's gap between the blocks of a row


@dataclasses.dataclass(frozen=True)
class Screen:
    """What the browser said about the screen a figure is shown on (`WITH_SCREEN`): the CSS pixels the batch
    picture spans (the width of the page's views column) and the device pixels per CSS pixel. Unknown (an API call,
    a test): the widest figures at one device pixel per CSS pixel."""

    picture_px: float | None = None
    pixel_ratio: float = 1.0

    @classmethod
    def of(cls, value: dict | None) -> "Screen":
        value = value or {}
        ratio = value.get("pixel_ratio") or 1.0
        return cls(value.get("picture_px") or None, min(MAX_PIXEL_RATIO, max(1.0, float(ratio))))

    def width_in(self, widest_in: float = batch_picture.BATCH_MAX_IN, per_row: int = 1,
                 min_px: float = 0.0) -> float:
        """A figure's width in inches: its share of the views column when `per_row` figures of at least `min_px`
        share a row there (a narrower column wraps them, as Gradio's row does), capped at `widest_in`; its text then
        reads at about its size in points. The widest when the browser did not say."""
        if not self.picture_px:
            return widest_in
        fitting = max(1, min(per_row, int((self.picture_px + GAP_PX) // (min_px + GAP_PX)) if min_px else per_row))
        shown_px = (self.picture_px - GAP_PX * (fitting - 1)) / fitting
        return min(widest_in, shown_px / plots.FIGURE_DPI)

    @property
    def dpi(self) -> float:
        """Pixels per inch to draw a figure with: a device pixel per device pixel of the screen (the page shows each
        figure at FIGURE_DPI CSS pixels per inch; its layout and text sizes, in inches and points, do not change)."""
        return plots.FIGURE_DPI * self.pixel_ratio
