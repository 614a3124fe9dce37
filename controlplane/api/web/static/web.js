// The web view's script: times in the browser's zone, and the live part of a page kept current.
// It follows the daemon's event stream (/v1/events, served on this listener as /ui/v1/events) through a
// worker (events.js): on each audit or state event it fetches the page's live part (?fragment=1) and puts
// it in place, no reload.
// Every 5 s it also asks /ui/stamp (the page's data-stamp-url) whether anything changed that makes no event
// (Triton's reachability; on the Fleet page, what the other hosts report).
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
  var note = document.getElementById("live-note");
  var stamp = live.getAttribute("data-stamp");
  var shown = null;  // the live part last put in place (the served one until then)
  var opened = false;
  var busy = false;
  var again = false;
  function say(text) {
    if (note && note.textContent !== text) {
      note.textContent = text;
    }
  }
  function refresh() {
    if (busy) {
      again = true;
      return;
    }
    busy = true;
    fetch(live.getAttribute("data-fragment"), {credentials: "same-origin", cache: "no-store"})
      .then(function (answer) {
        if (!answer.ok) {
          throw new Error("fragment " + answer.status);
        }
        return answer.text();
      })
      .then(function (html) {
        if (html !== shown) {
          shown = html;
          live.innerHTML = html;
          localize(live);
        }
      })
      .catch(function () {
        say("Live updates paused: the daemon does not answer (retrying).");
      })
      .then(function () {
        busy = false;
        if (again) {
          again = false;
          window.setTimeout(refresh, 100);
        }
      });
  }
  // From the newest audit record the page was rendered with: what happened since is replayed. The stream is
  // followed by a worker (events.js), so the page is complete without it: a browser that waits for the
  // network to go quiet (headless Chromium's --virtual-time-budget) is not held by a stream that never ends.
  var on = {
    open: function () {
      live.setAttribute("data-via", "events");
      say("Live: follows the daemon's events.");
      if (opened) {
        refresh();  // a reconnect: state changes are not replayed, so look again
      }
      opened = true;
    },
    audit: refresh,
    state: refresh,
    error: function () {
      live.removeAttribute("data-via");
      say("Live updates paused: the daemon does not answer (retrying).");
    }
  };
  var after = live.getAttribute("data-after") || "0";
  if (window.Worker) {
    var follower = new Worker("/ui/static/events.js");
    follower.addEventListener("message", function (event) {
      if (on[event.data]) {
        on[event.data]();
      }
    });
    follower.postMessage({after: after});
  } else {
    var source = new EventSource("/ui/v1/events?after=" + encodeURIComponent(after));
    Object.keys(on).forEach(function (kind) {
      source.addEventListener(kind, on[kind]);
    });
  }
  function check() {
    fetch(live.getAttribute("data-stamp-url") || "/ui/stamp", {credentials: "same-origin", cache: "no-store"})
      .then(function (answer) {
        return answer.ok ? answer.json() : null;
      })
      .then(function (body) {
        if (body && body.stamp !== stamp) {
          stamp = body.stamp;
          refresh();
        }
      }, function () {})
      .then(function () {
        window.setTimeout(check, 5000);
      });
  }
  window.setTimeout(check, 5000);
}());
