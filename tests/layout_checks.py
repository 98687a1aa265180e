"""What a layout test measures in the browser (JavaScript run by Playwright's `page.evaluate`), each returning the
defects it finds as plain dicts with the numbers that show them, so that a failing test says what broke and by how
much:

- `NARROW_CELLS`: table cells narrower than their longest word (the browser then breaks the word, letters stacked one
  a line);
- `OVERFLOWS`: content wider than its box (a card, a cell, a table, a figure): text past its cell, card or number,
  text cut by a box that hides its overflow or hidden past the edge of a box that scrolls sideways (a sideways
  scroll nobody sees), text or a box past the window; the run's wide tables, which scroll sideways by design, and
  text cut with an ellipsis are not defects;
- `FIGURES`: each figure's image (matplotlib's, in a `gr.Plot`) with its drawn and shown widths and the screen's
  device pixels per CSS pixel;
- `POSITIONS`: where Run, the line beside it with the predicted time and memory, the settings and the first figure
  are on the page, and the sticky action bar's height.
"""

from __future__ import annotations

# Elements whose text must stay inside them: a table cell, a headline card or one of its three numbers.
TEXT_BOXES = "td, th, .glance-card, .glance-stat"
# Boxes whose content must fit inside them: the above, tables, the headline's row of cards, every Gradio block (each
# markdown, plot and table is one), a markdown's body and each figure's image.
CONTENT_BOXES = f"{TEXT_BOXES}, table, .glance, .block, .prose, [data-testid=matplotlib] img"
# Where sideways scrolling is the design: the run's wide tables (Gradio dataframes, their first column pinned; on a
# phone page.css says "swipe the table sideways").
SCROLLING_TABLES = "#results, #contamination, #history"

# A short name for an element in a report: the id of the nearest element that has one (the page's elem_ids: #cost,
# #headline, ...), then the element itself (tag, id, first two classes).
_NAMING = """
const ownName = element => `${element.tagName.toLowerCase()}${element.id ? '#' + element.id : ''}` +
  (typeof element.className === 'string' && element.className.trim()
    ? '.' + element.className.trim().split(/\\s+/).slice(0, 2).join('.') : '');
const nameOf = element => {
  const owner = element.id ? null : element.parentElement?.closest('[id]:not([id=""])');
  return (owner && owner !== document.body ? `#${owner.id} ` : '') + ownName(element);
};
const shown = element => element.getClientRects().length > 0 && getComputedStyle(element).visibility !== 'hidden';
const cut = text => text.replace(/\\s+/g, ' ').trim().slice(0, 60);
const TOLERANCE_PX = 2;  // sub-pixel rounding of boxes and text
"""

NARROW_CELLS = """() => {""" + _NAMING + """
  const ruler = document.createElement('canvas').getContext('2d');
  // A long name cut on purpose, with an ellipsis (a download's file name), needs no room for its whole word.
  const ellipsized = (element, cell) => {
    for (let node = element; node && node !== cell.parentElement; node = node.parentElement) {
      const style = getComputedStyle(node);
      if (style.textOverflow === 'ellipsis' && ['hidden', 'clip'].includes(style.overflowX)) return true;
    }
    return false;
  };
  const found = [];
  for (const cell of document.querySelectorAll('td, th')) {
    if (!shown(cell)) continue;
    const style = getComputedStyle(cell);
    const room = cell.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    let longest = {word: '', px: 0};
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      if (!shown(node.parentElement) || ellipsized(node.parentElement, cell)) continue;
      const font = getComputedStyle(node.parentElement);
      ruler.font = `${font.fontStyle} ${font.fontWeight} ${font.fontSize} ${font.fontFamily}`;
      for (const word of node.textContent.split(/\\s+/)) {
        const px = ruler.measureText(word).width;
        if (px > longest.px) longest = {word, px};
      }
    }
    if (longest.px > room + TOLERANCE_PX)
      found.push({cell: nameOf(cell), text: cut(cell.innerText), cell_px: Math.round(room),
                  word: longest.word, word_px: Math.round(longest.px),
                  cell_height_px: Math.round(cell.getBoundingClientRect().height)});
  }
  return found;
}"""

OVERFLOWS = """(selectors) => {""" + _NAMING + """
  const windowPx = document.documentElement.clientWidth;
  const overflowOf = element => getComputedStyle(element).overflowX;
  const scrolls = element => ['auto', 'scroll'].includes(overflowOf(element));
  const hides = element => ['hidden', 'clip'].includes(overflowOf(element));
  // A table meant to scroll sideways (page.css: on a phone, with a line that says so).
  const meantToScroll = element => scrolls(element) && element.closest(selectors.scrolling) !== null;
  // Text cut on purpose, with an ellipsis that says so (a long file name), or clipped to a pixel for screen readers.
  const cutOnPurpose = element => {
    for (let node = element; node; node = node.parentElement) {
      const style = getComputedStyle(node), box = node.getBoundingClientRect();
      if (hides(node) && (style.textOverflow === 'ellipsis' || box.width <= 2 || box.height <= 2)) return true;
    }
    return false;
  };
  const found = [];
  // 1. Boxes whose content is wider than they are: it spills out (a card's number past its edge), is cut (a box
  //    that hides its overflow) or is hidden past the box's edge until scrolled (a table wider than its block).
  for (const box of document.querySelectorAll(selectors.content)) {
    if (!shown(box) || !box.clientWidth || meantToScroll(box) || cutOnPurpose(box)) continue;
    const over = box.scrollWidth - box.clientWidth;
    if (over > TOLERANCE_PX)
      found.push({what: scrolls(box) ? 'content scrolls sideways inside its box' : hides(box)
                    ? 'content cut by its box' : 'content wider than its box',
                  box: nameOf(box), box_px: box.clientWidth, content_px: box.scrollWidth, over_px: over,
                  text: cut(box.innerText ?? '')});
  }
  // 2. Text past the boxes that hold it (a cell, a card, one of its numbers), past a box that hides it or scrolls it
  //    out of sight (cut where a person reads it), or past the window.
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const parent = node.parentElement;
    if (!node.textContent.trim() || !parent || !shown(parent) || cutOnPurpose(parent)) continue;
    if (parent.closest('script, style, noscript, textarea, select')) continue;
    const range = document.createRange();
    range.selectNodeContents(node);
    const rects = [...range.getClientRects()].filter(rect => rect.width > 0);
    if (!rects.length) continue;
    const left = Math.min(...rects.map(rect => rect.left)), right = Math.max(...rects.map(rect => rect.right));
    const beyond = element => {
      const box = element.getBoundingClientRect();
      return {box, px: Math.max(box.left - left, right - box.right)};
    };
    let reachable = false, cutHere = false;
    for (let element = parent; element && element !== document.body; element = element.parentElement) {
      if (meantToScroll(element)) { reachable = true; break; }
      const holds = element.matches(selectors.text), cuts = hides(element) || scrolls(element);
      if (!holds && !cuts) continue;
      const {box, px} = beyond(element);
      if (px <= TOLERANCE_PX) continue;
      if (holds)  // each box it leaves: one of a card's numbers, then the card
        found.push({what: 'text past its box', box: nameOf(element), box_px: Math.round(box.width),
                    over_px: Math.round(px), text: cut(node.textContent)});
      if (cuts) {
        found.push({what: scrolls(element) ? 'text out of sight until its box is scrolled sideways'
                      : 'text cut by a box that hides it', box: nameOf(element), box_px: Math.round(box.width),
                    over_px: Math.round(px), text: cut(node.textContent)});
        cutHere = true;
        break;  // cut here: the boxes around it (the window too) do not show it either
      }
    }
    if (!reachable && !cutHere && (right > windowPx + TOLERANCE_PX || left < -TOLERANCE_PX))
      found.push({what: 'text past the window', box: nameOf(parent), box_px: windowPx,
                  over_px: Math.round(Math.max(right - windowPx, -left)), text: cut(node.textContent)});
  }
  // 3. Boxes past the window's right edge that no box within the window scrolls or clips.
  for (const element of document.querySelectorAll(selectors.content)) {
    const box = element.getBoundingClientRect();
    if (!shown(element) || !box.width || box.right <= windowPx + TOLERANCE_PX) continue;
    let held = false;
    for (let node = element.parentElement; node && node !== document.body; node = node.parentElement)
      if ((scrolls(node) || hides(node)) && node.getBoundingClientRect().right <= windowPx + TOLERANCE_PX) {
        held = true;
        break;
      }
    if (!held) found.push({what: 'box past the window', box: nameOf(element), box_px: Math.round(box.width),
                           over_px: Math.round(box.right - windowPx), text: cut(element.innerText ?? '')});
  }
  // The page itself scrolls sideways.
  const page = document.documentElement.scrollWidth - window.innerWidth;
  if (page > 0) found.push({what: 'page scrolls sideways', box: 'html', box_px: window.innerWidth, over_px: page,
                            text: ''});
  return found;
}"""

FIGURES = """() => [...document.querySelectorAll('[data-testid=matplotlib] img')].filter(image => image.clientWidth)
  .map(image => ({figure: image.closest('.block[id]')?.id ?? image.closest('[id]')?.id ?? '?',
                  drawn_px: image.naturalWidth, shown_px: image.clientWidth, pixel_ratio: window.devicePixelRatio}))"""

# Every figure's image loaded (a handler's new image replaces the old one asynchronously).
FIGURES_LOADED = """() => [...document.querySelectorAll('[data-testid=matplotlib] img')]
  .every(image => image.complete && (image.naturalWidth > 0 || !image.clientWidth))"""

# Page coordinates (from the top of the page, not the window) of what the position checks compare.
POSITIONS = """() => {
  const top = element => element ? element.getBoundingClientRect().top + window.scrollY : null;
  const bottom = element => element ? element.getBoundingClientRect().bottom + window.scrollY : null;
  // The line beside Run that says what Run will cost (time, peak memory, warnings), when it says it.
  const forecast = document.querySelector('#forecast');
  const predicted = forecast && /Run: about/.test(forecast.innerText) ? [forecast] : [];
  const figures = [...document.querySelectorAll('[data-testid=matplotlib] img')].filter(image => image.clientWidth);
  return {
    window_px: window.innerHeight,
    run_top_px: top(document.querySelector('#run')),
    predicted_bottom_px: predicted.length ? Math.max(...predicted.map(bottom)) : null,
    forecast_text: forecast?.innerText.trim() ?? '',
    settings_top_px: top(document.querySelector('#model')),
    first_figure: figures.length ? {figure: figures[0].closest('.block[id]')?.id, top_px: Math.min(...figures.map(top))}
                                 : null,
    action_bar_px: document.querySelector('#action-bar').getBoundingClientRect().height,
  };
}"""

SELECTORS = {"text": TEXT_BOXES, "content": CONTENT_BOXES, "scrolling": SCROLLING_TABLES}


def figure_defects(figures: list[dict], tolerance: float = 0.03) -> list[dict]:
    """Figures drawn with fewer pixels than the screen shows them with (soft): drawn width < shown width x device
    pixels per CSS pixel, by more than `tolerance`."""
    return [{**figure, "needed_px": round(figure["shown_px"] * figure["pixel_ratio"]),
             "sharpness": round(figure["drawn_px"] / (figure["shown_px"] * figure["pixel_ratio"]), 2)}
            for figure in figures if figure["drawn_px"] < figure["shown_px"] * figure["pixel_ratio"] * (1 - tolerance)]


def described(defects: list[dict]) -> str:
    """The defects one a line for an assertion message; those of one kind in one box (every text of a table cut by
    the same edge) in one line, with how many and the largest overflow."""
    groups: dict[tuple, list[dict]] = {}
    for defect in defects:
        groups.setdefault((defect.get("what"), defect.get("box"), defect.get("cell")), []).append(defect)
    lines = []
    for members in groups.values():
        widest = max(members, key=lambda defect: defect.get("over_px", defect.get("word_px", 0)))
        many = f" ({len(members)} like it)" if len(members) > 1 and "what" in widest else ""
        lines.append(", ".join(f"{key}={value}" for key, value in widest.items()) + many)
    return "\n".join(lines)
