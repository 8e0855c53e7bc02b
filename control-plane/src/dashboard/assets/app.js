// lasthop console: the one piece of script, progressive enhancement only. Buttons marked
// data-copy copy their text to the clipboard; without JavaScript the short URL is still there
// to select.
document.addEventListener("click", function (event) {
  var button = event.target.closest("button[data-copy]");
  if (!button || !navigator.clipboard) return;
  event.preventDefault();
  navigator.clipboard.writeText(button.getAttribute("data-copy")).then(function () {
    button.textContent = "Copied";
    setTimeout(function () { button.textContent = "Copy"; }, 1500);
  });
});

// Live refresh: an element with data-refresh="SECONDS" and an id is fetched again from the same
// page every SECONDS while the tab is visible, and its contents replaced. Without JavaScript
// the page is the same, only still (reload it).
document.querySelectorAll("[data-refresh][id]").forEach(function (el) {
  var every = Math.max(5, parseInt(el.getAttribute("data-refresh"), 10) || 30) * 1000;
  setInterval(function () {
    if (document.hidden) return;
    fetch(location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (!html) return;
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById(el.id);
        if (fresh) el.innerHTML = fresh.innerHTML;
      })
      .catch(function () {});
  }, every);
});
