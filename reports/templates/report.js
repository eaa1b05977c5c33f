// Filtering by verdict. The state lives in the URL fragment
// (#verdict=fail,crash or #verdict=failures), so a filtered view can be linked to.
(function () {
  "use strict";
  var FAILURES = ["fail", "error", "crash", "hang"];
  var rows = Array.prototype.slice.call(document.querySelectorAll("tbody.contract"));
  // The list of unsatisfied contracts above the table follows the same filter.
  var failures = Array.prototype.slice.call(document.querySelectorAll("div.failure"));
  var boxes = Array.prototype.slice.call(document.querySelectorAll("input.verdict-filter"));
  var shown = document.getElementById("shown-count");

  function selected() {
    var match = /(?:^#|&)verdict=([^&]*)/.exec(window.location.hash);
    if (!match) { return []; }
    var names = decodeURIComponent(match[1]).split(",").filter(Boolean);
    return names.indexOf("failures") >= 0 ? names.concat(FAILURES) : names;
  }

  function apply() {
    var wanted = selected();
    var count = 0;
    rows.forEach(function (row) {
      var visible = wanted.length === 0 || wanted.indexOf(row.getAttribute("data-verdict")) >= 0;
      if (visible) { row.removeAttribute("hidden"); count += 1; } else { row.setAttribute("hidden", ""); }
    });
    failures.forEach(function (item) {
      var visible = wanted.length === 0 || wanted.indexOf(item.getAttribute("data-verdict")) >= 0;
      if (visible) { item.removeAttribute("hidden"); } else { item.setAttribute("hidden", ""); }
    });
    boxes.forEach(function (box) { box.checked = wanted.indexOf(box.value) >= 0; });
    shown.textContent = "Showing " + count + " of " + rows.length + " contracts";
    document.body.setAttribute("data-filter", wanted.join(","));
  }

  function setFilter(names) {
    var hash = names.length ? "#verdict=" + names.join(",") : "#";
    if (window.history && window.history.replaceState) {
      window.history.replaceState(null, "", hash);
    } else {
      window.location.hash = hash;
    }
    apply();
  }

  boxes.forEach(function (box) {
    box.addEventListener("change", function () {
      setFilter(boxes.filter(function (b) { return b.checked; }).map(function (b) { return b.value; }));
    });
  });
  document.getElementById("show-failures").addEventListener("click", function () { setFilter(FAILURES); });
  document.getElementById("show-all").addEventListener("click", function () { setFilter([]); });
  Array.prototype.forEach.call(document.querySelectorAll("button.copy"), function (button) {
    button.addEventListener("click", function () {
      var text = button.previousElementSibling.textContent;
      if (navigator.clipboard) { navigator.clipboard.writeText(text); }
    });
  });
  window.addEventListener("hashchange", apply);
  document.getElementById("filters").removeAttribute("hidden");
  apply();
})();
