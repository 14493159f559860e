// Keeps a job's page current until the job is final: counters, status, the block banner and
// the newest throttle events every 2 s; the chart on the first poll, every 10 s and in the
// poll that finds a block begun, ended or replaced (the server compares "shown_block"). The
// JSON comes from the admin's own /progress/ endpoint, the chart and the events' rows already
// rendered by the server.
(function () {
  "use strict";
  const box = document.getElementById("rj-job");
  if (!box || box.dataset.final === "true") return;
  const url = box.dataset.progressUrl;
  const banner = document.getElementById("rj-block-banner");
  const events = document.getElementById("rj-events");
  // Older pages of events stay as the operator paged them; the first follows the job.
  const followEvents = events && events.dataset.page === "1";
  // The failed calls' sample (the first few by index) is read again only when the count of
  // failures moved while it had room, and once at the end.
  const failedBox = document.getElementById("rj-failed");
  let failedShown = failedBox ? Number(failedBox.dataset.failed) : 0;
  let wantFailed = false;
  let polls = 0;
  // The key of the block the banner shows (the server's "blocked.key"); "" for none.
  let blockShown = banner ? banner.dataset.block || "" : "";

  function query(withChart, withFailed) {
    const params = new URLSearchParams();
    if (withChart) params.set("chart", "1");
    if (followEvents) params.set("events", "1");
    if (withFailed) params.set("failed", "1");
    if (banner) params.set("shown_block", blockShown);
    const text = params.toString();
    return url + (text ? "?" + text : "");
  }

  function show(data) {
    for (const el of document.querySelectorAll("#rj-job [data-field], #rj-events [data-field]")) {
      if (el.dataset.field in data) el.textContent = data[el.dataset.field];
    }
    // Our own template's HTML (admin.calls.job_calls_links_html), sent once the job is final.
    const links = document.querySelector("[data-calls-links]");
    if (links && data.calls_links) links.outerHTML = data.calls_links;
    // The ETA cell changes field as the job starts or pauses (job_progress_data's eta_field).
    const eta = box.querySelector('[data-field="eta"], [data-field="eta_note"]');
    if (eta) {
      eta.dataset.field = data.eta_field;
      eta.textContent = data[data.eta_field];
    }
    box.dataset.outcome = data.outcome;
    const status = box.querySelector('[data-field="status_display"]');
    if (status) status.dataset.outcome = data.outcome;
    const bar = box.querySelector(".rj-progress");
    bar.setAttribute("aria-valuenow", Math.round(data.ran_percent));
    bar.dataset.outcome = data.outcome;
    bar.title = data.status_display + ": " + data.done_text;
    bar.querySelector(".rj-progress-fill").style.width = data.ran_percent + "%";
    const cancelled = bar.querySelector(".rj-progress-cancelled");
    if (cancelled) cancelled.style.width = data.cancelled_percent + "%";
    bar.querySelector(".rj-progress-text").textContent = Math.floor(data.ran_percent) + "%";
    for (const live of box.querySelectorAll("[data-live]")) live.hidden = data.final;
    for (const button of box.querySelectorAll("button[data-action]")) {
      button.hidden = !data.actions.includes(button.dataset.action);
    }
    if (banner) {
      blockShown = data.blocked ? data.blocked.key : "";
      banner.hidden = !data.blocked;
      banner.textContent = data.blocked ? data.blocked.text : "";
    }
    if (data.events_rows !== undefined && events) {
      events.querySelector("tbody").innerHTML = data.events_rows;
      // the first page followed: "page 1 of N" and its "older" link once there is a second
      const pages = document.getElementById("rj-events-pages");
      if (pages) {
        pages.hidden = data.events_pages < 2;
        pages.querySelector("[data-older]").hidden = data.events_pages < 2;
      }
    }
    if (data.chart) document.getElementById("rj-chart").innerHTML = data.chart;
    if (failedBox) {
      if (data.failed_html !== undefined) {
        failedBox.querySelector(".rj-failed-sample").innerHTML = data.failed_html;
        failedBox.dataset.shown = failedBox.querySelectorAll("tbody tr").length;
        failedShown = data.failed;
      }
      // 10: the sample's size (selectors.jobs.failed_call_sample)
      wantFailed = data.failed !== failedShown && Number(failedBox.dataset.shown) < 10;
    }
  }

  async function poll() {
    const withChart = polls % 5 === 0;
    polls += 1;
    try {
      const response = await fetch(query(withChart, wantFailed), {credentials: "same-origin"});
      if (!response.ok) throw new Error(response.status);
      const data = await response.json();
      show(data);
      if (data.final) {
        // the chart and the failed calls as the job ended
        const last = await fetch(query(true, failedBox !== null), {credentials: "same-origin"});
        if (last.ok) show(await last.json());
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
