// The outbox dashboard's refresh: every data-refresh-seconds, fetch the page body again
// (?fragment=1, same origin, the admin session's cookie) and swap it in. A failed fetch
// leaves the last body in place and says so, and so does any answer that is not the
// fragment (the login page once the admin session expired); nothing else runs here.
(function () {
  "use strict";
  function start() {
    var box = document.getElementById("outbox-dashboard");
    if (!box || !window.fetch) return;
    var url = box.getAttribute("data-refresh-url");
    var every = Math.max(2, parseInt(box.getAttribute("data-refresh-seconds"), 10) || 10) * 1000;
    function refresh() {
      fetch(url, { credentials: "same-origin", headers: { "X-Requested-With": "XMLHttpRequest" } })
        .then(function (response) {
          // An expired admin session answers with the login page (after a redirect):
          // only a response marked as the dashboard's fragment replaces the body.
          if (response.redirected) throw new Error("signed out: reload the page to sign in");
          // Valkey away: keep the last charts, and the note that says so, on screen.
          if (response.status === 503) throw new Error("Valkey cannot be read");
          if (!response.ok) throw new Error("HTTP " + response.status);
          if (response.headers.get("X-Outbox-Dashboard-Fragment") !== "1") {
            throw new Error("not the dashboard's answer");
          }
          return response.text();
        })
        .then(function (html) {
          box.innerHTML = html;
          box.setAttribute("data-refreshed", String(Date.now()));
        })
        .catch(function (error) {
          var note = box.querySelector(".outbox-read-at");
          if (note) note.textContent = "Refresh failed (" + error.message + "); showing the last reading.";
        })
        .then(function () { window.setTimeout(refresh, every); });
    }
    window.setTimeout(refresh, every);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
