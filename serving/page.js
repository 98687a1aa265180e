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
}
