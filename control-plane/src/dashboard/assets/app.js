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
