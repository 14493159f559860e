// Keeps the overview current: every few seconds it asks the page's JSON endpoint, which
// renders the page's sections again, and swaps them in. A failed refresh leaves the last
// figures up, says so, and is retried on the next tick.
(function () {
  "use strict";
  const root = document.getElementById("rj-overview");
  if (!root) return;
  const url = root.dataset.dataUrl;
  const every = (Number(root.dataset.refreshSeconds) || 2) * 1000;
  const sections = {
    apis: document.querySelector("#rj-overview-apis tbody"),
    jobs: document.querySelector("#rj-overview-jobs tbody"),
    finished: document.querySelector("#rj-overview-finished tbody"),
    attention: document.getElementById("rj-attention"),
  };
  const stale = root.querySelector(".rj-overview-stale");
  const refreshedText = root.querySelector('[data-field="refreshed_text"]');

  async function refresh() {
    try {
      const response = await fetch(url, {
        credentials: "same-origin",
        headers: {Accept: "application/json"},
      });
      if (!response.ok) throw new Error("HTTP " + response.status);
      const data = await response.json();
      for (const [name, element] of Object.entries(sections)) {
        if (element && name in data.html) element.innerHTML = data.html[name];
      }
      refreshedText.textContent = data.refreshed_text;
      root.dataset.refreshed = data.refreshed;
      stale.hidden = true;
    } catch (err) {
      stale.hidden = false; // signed out, server down: keep what is shown, try again
    }
    setTimeout(refresh, every);
  }
  setTimeout(refresh, every);
})();
