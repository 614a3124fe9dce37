// The daemon's event stream (/ui/v1/events), followed in a worker of its own for web.js, which it tells of
// each event. Why a worker: a stream never ends, and a browser that waits for the network to go quiet
// before it calls a page done (headless Chromium's --virtual-time-budget, issue 57) never did while the page
// itself held one open; a worker's stream does not hold the page. The page renders complete without it.
(function () {
  "use strict";
  var source = null;
  self.addEventListener("message", function (event) {
    if (source !== null) {
      return;
    }
    source = new EventSource("/ui/v1/events?after=" + encodeURIComponent(String(event.data.after || "0")));
    ["open", "audit", "state", "error"].forEach(function (kind) {
      source.addEventListener(kind, function () {
        self.postMessage(kind);
      });
    });
  });
}());
