// Live refresh of the cache dashboard: polls the JSON endpoint and swaps in the
// server-rendered fragment (figures, tables, SVG charts), so there is one renderer.
(function () {
  "use strict";

  function start() {
    var root = document.getElementById("dashboard");
    if (!root) return;
    var url = root.dataset.url;
    var interval = parseInt(root.dataset.intervalMs || "3000", 10);
    var live = document.getElementById("live");
    var updated = document.getElementById("updated-at");
    var state = document.getElementById("refresh-state");
    var busy = false;

    function refresh() {
      if (busy || document.hidden) return;
      busy = true;
      fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (r) {
          if (!r.ok) throw new Error("HTTP " + r.status);
          return r.json();
        })
        .then(function (data) {
          live.innerHTML = data.html; // our own template's output, autoescaped
          updated.textContent = data.generated_at;
          updated.dataset.value = data.generated_at;
          state.textContent = "";
          root.dataset.refreshes = String(parseInt(root.dataset.refreshes || "0", 10) + 1);
        })
        .catch(function (err) {
          state.textContent = " (refresh failed: " + err.message + ")";
        })
        .finally(function () {
          busy = false;
        });
    }

    setInterval(refresh, interval);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
