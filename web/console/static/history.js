// The history page's live refresh: every few seconds, while the tab is
// shown and "Live" is ticked, the page is read again and its charts
// swapped in. Without JavaScript the page is the same, refreshed by hand.
(function () {
  var box = document.getElementById("live-refresh");
  if (!box || !window.fetch || !window.DOMParser) return;
  box.parentNode.hidden = false;
  var seconds = Number(box.dataset.seconds) || 15;
  setInterval(function () {
    if (!box.checked || document.hidden) return;
    fetch(location.href, { credentials: "same-origin", redirect: "manual" })
      .then(function (answer) {
        if (answer.status !== 200) { box.checked = false; return null; }  // signed out
        return answer.text();
      })
      .then(function (html) {
        if (!html) return;
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("history-charts");
        if (fresh) document.getElementById("history-charts").replaceWith(fresh);
      })
      .catch(function () {});
  }, seconds * 1000);
})();
