// The admin's Submit a job page: how many calls the chosen file (or the values box) holds,
// counted in the browser before anything is sent. The server counts again on submit.
"use strict";
(function () {
  const NEWLINE = 10, QUOTE = 34, COMMA = 44, SPACE = 32, TAB = 9, CR = 13;
  // Read a file in slices: a file of millions of lines is never held whole.
  const SLICE_BYTES = 4 * 1024 * 1024;
  const numberFormat = new Intl.NumberFormat("en");

  function isBlank(byte) {
    return byte === SPACE || byte === TAB || byte === CR;
  }

  // JSONL: one call per line that holds something (blank lines are skipped).
  function jsonlCounter() {
    let calls = 0, filled = false;
    return {
      feed(bytes) {
        for (const byte of bytes) {
          if (byte === NEWLINE) { if (filled) calls += 1; filled = false; }
          else if (!filled && !isBlank(byte)) filled = true;
        }
      },
      finish() { return calls + (filled ? 1 : 0); },
    };
  }

  // CSV: one call per record after the header; a newline inside quotes does not end a record,
  // and a record of empty cells is skipped, as the server does. UTF-8 never puts a newline,
  // quote or comma byte inside another character, so bytes can be counted as they come.
  function csvCounter() {
    let records = 0, filled = false, quoted = false, header = true;
    return {
      feed(bytes) {
        for (const byte of bytes) {
          if (byte === QUOTE) { quoted = !quoted; continue; }
          if (quoted) { filled = true; continue; }
          if (byte === NEWLINE) {
            if (header) header = false;
            else if (filled) records += 1;
            filled = false;
          } else if (!filled && byte !== COMMA && !isBlank(byte)) filled = true;
        }
      },
      finish() { return records + (filled && !header ? 1 : 0); },
    };
  }

  function counterFor(name) {
    const lowered = name.toLowerCase();
    if (lowered.endsWith(".csv")) return csvCounter();
    if (lowered.endsWith(".jsonl") || lowered.endsWith(".ndjson")) return jsonlCounter();
    return null;
  }

  function callsText(count) {
    return `${numberFormat.format(count)} call${count === 1 ? "" : "s"}`;
  }

  async function countFile(file, counter) {
    for (let start = 0; start < file.size; start += SLICE_BYTES) {
      const slice = file.slice(start, start + SLICE_BYTES);
      counter.feed(new Uint8Array(await slice.arrayBuffer()));
    }
    return counter.finish();
  }

  function start() {
    const input = document.getElementById("id_calls_file");
    const shown = document.getElementById("calls-file-count");
    const kept = document.getElementById("kept-upload");
    const values = document.getElementById("id_values");
    const valuesShown = document.getElementById("values-count");
    if (input && shown) {
      let reading = 0;
      input.addEventListener("change", async () => {
        const file = input.files && input.files[0];
        const mine = ++reading;  // a later choice wins over a count still running
        if (kept) kept.hidden = Boolean(file);  // a new file replaces the kept one
        if (!file) { shown.textContent = ""; return; }
        const counter = counterFor(file.name);
        if (!counter) { shown.textContent = `${file.name}: use a .csv or .jsonl file`; return; }
        shown.textContent = `${file.name}: counting…`;
        try {
          const count = await countFile(file, counter);
          if (mine === reading) shown.textContent = `${file.name}: ${callsText(count)}`;
        } catch (error) {
          if (mine === reading) shown.textContent = `${file.name}: could not be read here`;
        }
      });
    }
    if (values && valuesShown) {
      const update = () => {
        const count = values.value.split("\n").filter((line) => line.trim()).length;
        valuesShown.textContent = count ? callsText(count) : "";
      };
      values.addEventListener("input", update);
      update();
    }
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
