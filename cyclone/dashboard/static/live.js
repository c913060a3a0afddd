// cyclone's dashboard: the page refreshes itself in place, without a reload.
//
// Every data-refresh seconds (set on <body> by the server; 0 turns it off) it fetches its
// own URL again and swaps the new <main> in, keeping the filter forms (GET) as the user
// left them. It holds off while the tab is hidden, while a form's field or button has the
// focus, while a <details> or <dialog> is open (an error being read, a confirmation),
// and while text is selected; the header says so. Without JavaScript the page is the
// same server-rendered page: reloading it shows what changed.
(function () {
  "use strict";
  var html = document.documentElement;
  var seconds = Number(document.body.getAttribute("data-refresh") || 0);
  var status = document.getElementById("live-status");
  if (!(seconds > 0) || !window.fetch || !window.DOMParser || !document.querySelector("main")) {
    return;
  }
  var inFlight = false;
  var updates = 0;

  function say(state, text) {
    html.setAttribute("data-live-state", state);
    if (status) {
      status.hidden = false;
      status.textContent = text;
    }
  }

  function holding() {
    if (document.hidden) return "hidden";
    var active = document.activeElement;
    if (active && active !== document.body && active.closest("form, dialog")) return "form";
    if (document.querySelector("main details[open], dialog[open]")) return "open";
    var selection = window.getSelection ? window.getSelection() : null;
    if (selection && !selection.isCollapsed) return "selection";
    return null;
  }

  function swap(text) {
    var fresh = new DOMParser().parseFromString(text, "text/html").querySelector("main");
    var main = document.querySelector("main");
    if (!fresh || !main) return;
    var kept = main.querySelectorAll("form[method=get]");
    var slots = fresh.querySelectorAll("form[method=get]");
    if (kept.length === slots.length) {
      for (var i = 0; i < kept.length; i++) slots[i].replaceWith(kept[i]);
    }
    main.replaceChildren.apply(main, Array.prototype.slice.call(fresh.childNodes));
    updates += 1;
    html.setAttribute("data-live-updates", String(updates));
  }

  function tick() {
    var reason = holding();
    if (reason) {
      say("paused-" + reason, "live: paused");
      return;
    }
    if (inFlight) return;
    inFlight = true;
    fetch(window.location.href, { credentials: "same-origin", cache: "no-store" })
      .then(function (response) {
        if (!response.ok || response.redirected) throw new Error("HTTP " + response.status);
        return response.text();
      })
      .then(function (text) {
        var late = holding(); // the user may have opened something while it loaded
        if (late) {
          say("paused-" + late, "live: paused");
          return;
        }
        swap(text);
        say("updated", "live: " + new Date().toLocaleTimeString());
      })
      .catch(function () {
        say("failed", "live: not updated, retrying");
      })
      .then(function () {
        inFlight = false;
      });
  }

  say("on", "live");
  window.setInterval(tick, seconds * 1000);
  document.addEventListener("visibilitychange", function () {
    if (!document.hidden) tick();
  });
})();
