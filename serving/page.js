() => {
  // Gradio 6.31 gives a matplotlib plot's image the alt "undefined plot visualising provided data" and rewrites it
  // with every new figure. Each plot here has a label (hidden, read by screen readers) that says what it shows:
  // it becomes the image's alt text whenever the image changes.
  const describe = () => {
    for (const image of document.querySelectorAll('[data-testid="matplotlib"] img')) {
      const label = image.closest(".block")?.querySelector('[data-testid="block-label"]')?.textContent.trim();
      if (label && image.alt !== label) image.alt = label;
    }
  };
  new MutationObserver(describe).observe(document.body, {subtree: true, childList: true, attributes: true,
                                                         attributeFilter: ["alt", "src"]});
  describe();

  // A slider's number box keeps what was typed out of its range: Gradio's slider puts the box back inside the range
  // when it loses focus (a typed 0 became 1, and Run then trained batch 1). The typed value already went to the
  // server on Enter or input, whose one message names the range (serving/widgets.py typed_slider); this stops the
  // blur before the slider sees it (a capture listener on the window runs first), only for a value out of range.
  window.addEventListener("blur", (event) => {
    const box = event.target;
    if (!(box instanceof HTMLInputElement) || box.type !== "number" || box.value === "") return;
    if (!box.closest(".block")?.querySelector('input[type="range"]')) return;
    const value = Number(box.value), low = Number(box.min), high = Number(box.max);
    if ((box.min !== "" && value < low) || (box.max !== "" && value > high)) event.stopImmediatePropagation();
  }, true);
}
