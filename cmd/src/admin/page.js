// Only enhances: the page works without it (a GET form filters, a
// <noscript> refresh reloads). With it, the filter acts as one types, and
// the page refreshes in place, keeping the fold and the filter.
(function () {
  "use strict";
  var input = document.getElementById("q");
  function filter() {
    var needle = (input && input.value || "").trim().toLowerCase();
    var rows = document.querySelectorAll("tr[data-name]");
    for (var i = 0; i < rows.length; i++) {
      var row = rows[i];
      var hay = (row.getAttribute("data-name") + " " + row.getAttribute("data-host")).toLowerCase();
      row.hidden = needle !== "" && hay.indexOf(needle) < 0;
    }
  }
  function refresh() {
    fetch(location.href, { headers: { Accept: "text/html" } })
      .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
      .then(function (text) {
        var next = new DOMParser().parseFromString(text, "text/html");
        var live = document.getElementById("live");
        var fresh = next.getElementById("live");
        if (!live || !fresh) return;
        var open = {};
        live.querySelectorAll("details[id]").forEach(function (d) { open[d.id] = d.open; });
        var typed = input ? input.value : "";
        var focused = document.activeElement === input;
        live.replaceWith(fresh);
        document.title = next.title;
        fresh.querySelectorAll("details[id]").forEach(function (d) {
          if (d.id in open) d.open = open[d.id];
        });
        input = document.getElementById("q");
        if (input) {
          input.value = typed;
          input.addEventListener("input", filter);
          if (focused) input.focus();
        }
        filter();
      })
      .catch(function () { /* the next refresh tries again */ });
  }
  if (input) input.addEventListener("input", filter);
  setInterval(refresh, 1000 * Number(document.body.dataset.refreshSeconds || 10));
})();
