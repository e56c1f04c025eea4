/* imagebench report: table sorting and image filters. Plain JS, no dependencies, no network. */
(function () {
  "use strict";

  function cellValue(td, type) {
    var v = td.getAttribute("data-v");
    if (v === null) { v = td.textContent.trim(); }
    if (v === "") { return null; }
    if (type === "num") {
      var n = parseFloat(v);
      return isNaN(n) ? null : n;
    }
    return v.toLowerCase();
  }

  function compare(a, b, type) {
    if (type === "num") { return a - b; }
    return a < b ? -1 : (a > b ? 1 : 0);
  }

  /* Sort a table body by column `col`; empty cells always last; ties keep the original order. */
  function sortTable(table, col, type, dir) {
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    var keyed = rows.map(function (tr) {
      return { tr: tr, v: cellValue(tr.cells[col], type), i: parseInt(tr.getAttribute("data-i"), 10) };
    });
    keyed.sort(function (x, y) {
      if (x.v === null && y.v === null) { return x.i - y.i; }
      if (x.v === null) { return 1; }
      if (y.v === null) { return -1; }
      var c = compare(x.v, y.v, type);
      if (dir === "descending") { c = -c; }
      return c !== 0 ? c : x.i - y.i;
    });
    keyed.forEach(function (k) { body.appendChild(k.tr); });
  }

  Array.prototype.forEach.call(document.querySelectorAll("table.sortable"), function (table) {
    if (!table.tHead || !table.tBodies.length) { return; }
    Array.prototype.forEach.call(table.tBodies[0].rows, function (tr, i) { tr.setAttribute("data-i", String(i)); });
    var ths = table.tHead.rows[0].cells;
    Array.prototype.forEach.call(ths, function (th, col) {
      var btn = th.querySelector("button.sort");
      if (!btn) { return; }
      btn.addEventListener("click", function () {
        var dir = th.getAttribute("aria-sort") === "ascending" ? "descending" : "ascending";
        Array.prototype.forEach.call(ths, function (other) {
          if (other !== th && other.hasAttribute("aria-sort")) { other.setAttribute("aria-sort", "none"); }
        });
        th.setAttribute("aria-sort", dir);
        sortTable(table, col, th.getAttribute("data-type") || "text", dir);
      });
    });
  });

  /* Model pages: show only the cards of one verdict / state. */
  var buttons = document.querySelectorAll("button.filter");
  Array.prototype.forEach.call(buttons, function (btn) {
    btn.addEventListener("click", function () {
      var want = btn.getAttribute("data-filter");
      Array.prototype.forEach.call(buttons, function (b) {
        var on = b === btn;
        b.classList.toggle("active", on);
        b.setAttribute("aria-pressed", on ? "true" : "false");
      });
      var shown = 0;
      Array.prototype.forEach.call(document.querySelectorAll("section.category"), function (sec) {
        var inSec = 0;
        Array.prototype.forEach.call(sec.querySelectorAll("article.card"), function (card) {
          var ok = want === "all" || card.getAttribute("data-filter") === want;
          card.hidden = !ok;
          if (ok) { inSec += 1; }
        });
        sec.hidden = inSec === 0;
        shown += inSec;
      });
      var none = document.getElementById("no-match");
      if (none) { none.hidden = shown !== 0; }
    });
  });
})();
