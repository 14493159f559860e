// Keeps a running job's page current: counters every 2 s, the chart every 10 s, until the
// job is final. The JSON comes from the admin's own /progress/ endpoint.
(function () {
  "use strict";
  const box = document.getElementById("rj-job");
  if (!box || box.dataset.final === "true") return;
  const url = box.dataset.progressUrl;
  let polls = 0;
  async function poll() {
    const withChart = polls % 5 === 4;
    polls += 1;
    try {
      const response = await fetch(url + (withChart ? "?chart=1" : ""), {credentials: "same-origin"});
      if (!response.ok) throw new Error(response.status);
      const data = await response.json();
      for (const el of box.querySelectorAll("[data-field]")) {
        if (el.dataset.field in data) el.textContent = data[el.dataset.field];
      }
      const bar = box.querySelector(".rj-progress");
      bar.setAttribute("aria-valuenow", Math.round(data.progress));
      bar.dataset.status = data.status;
      bar.querySelector(".rj-progress-fill").style.width = data.progress + "%";
      bar.querySelector(".rj-progress-text").textContent = Math.floor(data.progress) + "%";
      for (const button of box.querySelectorAll("button[data-action]")) {
        button.hidden = !data.actions.includes(button.dataset.action);
      }
      if (data.chart) document.getElementById("rj-chart").innerHTML = data.chart;
      if (data.final) {
        if (!withChart) {
          const last = await fetch(url + "?chart=1", {credentials: "same-origin"});
          if (last.ok) document.getElementById("rj-chart").innerHTML = (await last.json()).chart;
        }
        box.dataset.final = "true";
        return;
      }
    } catch (err) {
      // a missed poll is retried on the next tick
    }
    setTimeout(poll, 2000);
  }
  setTimeout(poll, 2000);
})();
