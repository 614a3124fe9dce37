// The web view's only script: times in the browser's zone, and the live part of a page kept current.
// Every second it asks /ui/stamp whether anything the pages show changed; when it did, it fetches the
// page's live part (?fragment=1) and puts it in place: no reload, focus and scroll stay where they were.
(function () {
  "use strict";
  function localize(root) {
    root.querySelectorAll("time[data-local]").forEach(function (el) {
      var when = new Date(el.getAttribute("datetime"));
      if (!isNaN(when.getTime())) {
        el.textContent = when.toLocaleString();
      }
    });
  }
  localize(document);
  var live = document.getElementById("live");
  if (!live) {
    return;
  }
  var stamp = live.getAttribute("data-stamp");
  var note = document.getElementById("live-note");
  function say(text) {
    if (note && note.textContent !== text) {
      note.textContent = text;
    }
  }
  function tick() {
    fetch("/ui/stamp", {credentials: "same-origin", cache: "no-store"})
      .then(function (answer) {
        if (!answer.ok) {
          throw new Error("stamp " + answer.status);
        }
        return answer.json();
      })
      .then(function (body) {
        if (body.stamp === stamp) {
          return null;
        }
        return fetch(live.getAttribute("data-fragment"), {credentials: "same-origin", cache: "no-store"})
          .then(function (answer) {
            if (!answer.ok) {
              throw new Error("fragment " + answer.status);
            }
            return answer.text();
          })
          .then(function (html) {
            live.innerHTML = html;
            localize(live);
            stamp = body.stamp;
            live.setAttribute("data-stamp", stamp);
          });
      })
      .then(function () {
        say("Live: updates within a second.");
      }, function () {
        say("Live updates paused: the daemon does not answer (retrying).");
      })
      .then(function () {
        window.setTimeout(tick, 1000);
      });
  }
  window.setTimeout(tick, 1000);
}());
