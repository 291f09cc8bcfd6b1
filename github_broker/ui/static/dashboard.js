// The dashboard without reloads: live updates over server-sent events (/ui/live), and the
// controls' forms sent with fetch after a confirm() for destructive ones. Without this script
// the page reloads itself (<noscript> meta refresh) and the forms post as plain forms.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live) return;
  var state = document.getElementById("live-state");
  var flashBox = document.getElementById("flash");
  var POLL_MS = 5000; // while no stream can be had: fetch the page this often
  var RETRY_MS = 30000; // and try a stream again this often
  var source = null;
  var poller = null;

  function say(text, cls) {
    if (!state) return;
    state.textContent = text;
    state.className = "live-state " + (cls || "");
  }

  function flash(ok, text) {
    if (!flashBox) return;
    flashBox.textContent = text;
    flashBox.className = "flash " + (ok ? "ok" : "bad");
    flashBox.hidden = false;
  }

  // Swap in a fresh copy of #live, keeping what the maintainer is doing: open <details>,
  // what they typed, and the focus.
  function fieldKey(el) {
    var details = el.closest("details");
    return (details ? details.id : "") + "|" + (el.form ? el.form.getAttribute("action") : "") +
      "|" + el.name;
  }
  function swap(html) {
    var open = {};
    live.querySelectorAll("details[open]").forEach(function (d) { open[d.id] = true; });
    var typed = {};
    live.querySelectorAll("details[open] input:not([type=hidden]), details[open] textarea")
      .forEach(function (el) {
        typed[fieldKey(el)] = el.type === "checkbox" ? el.checked : el.value;
      });
    var focused = live.contains(document.activeElement) && document.activeElement.name
      ? fieldKey(document.activeElement) : null;
    live.innerHTML = html;
    live.querySelectorAll("details").forEach(function (d) { if (open[d.id]) d.open = true; });
    live.querySelectorAll("details[open] input:not([type=hidden]), details[open] textarea")
      .forEach(function (el) {
        var key = fieldKey(el);
        if (!(key in typed)) return;
        if (el.type === "checkbox") el.checked = typed[key]; else el.value = typed[key];
        if (key === focused) el.focus();
      });
  }

  function refresh() {
    return fetch(location.pathname + location.search,
      { headers: { Accept: "text/html" }, cache: "no-store", credentials: "same-origin" })
      .then(function (r) {
        if (r.redirected && r.url.indexOf("/ui/login") >= 0) { location.href = "/ui/login"; }
        return r.text();
      })
      .then(function (text) {
        var fresh = new DOMParser().parseFromString(text, "text/html").getElementById("live");
        if (fresh) swap(fresh.innerHTML);
      })
      .catch(function () { say("cannot reach the broker", "bad"); });
  }

  function connect() {
    if (!window.EventSource || !live.dataset.stream) { startPolling(); return; }
    source = new EventSource(live.dataset.stream);
    source.onopen = function () {
      say("live", "ok");
      if (poller) { clearInterval(poller); poller = null; }
    };
    source.addEventListener("update", function (ev) {
      swap(JSON.parse(ev.data).html);
      say("live", "ok");
    });
    source.addEventListener("trouble", function (ev) {
      say("cannot read the broker's state: " + JSON.parse(ev.data).detail, "bad");
    });
    source.addEventListener("logout", function () { location.href = "/ui/login"; });
    source.onerror = function () {
      if (source.readyState === EventSource.CLOSED) {
        // Refused (the process serves enough streams, or the login ended): poll meanwhile.
        source = null;
        startPolling();
        setTimeout(connect, RETRY_MS);
      } else {
        say("reconnecting…", "warn");
      }
    };
  }

  function startPolling() {
    say("updating every " + POLL_MS / 1000 + " s", "warn");
    if (!poller) poller = setInterval(refresh, POLL_MS);
  }

  document.addEventListener("submit", function (ev) {
    var form = ev.target;
    if (!form.classList.contains("act")) return;
    ev.preventDefault();
    var button = ev.submitter || form.querySelector("button[type=submit]");
    var question = button && button.dataset.confirm;
    if (question && !window.confirm(question)) return;
    var body = new URLSearchParams(new FormData(form));
    if (question) body.set("confirmed", "1");
    var url = button && button.getAttribute("formaction") || form.getAttribute("action");
    fetch(url, {
      method: "POST",
      body: body,
      headers: { Accept: "application/json" },
      credentials: "same-origin",
    }).then(function (r) {
      return r.json().catch(function () { return { detail: r.statusText }; }).then(function (a) {
        if (r.status === 401) { location.href = "/ui/login"; return; }
        if (r.ok) {
          flash(!/^(refused|not delivered|nothing)/.test(a.outcome),
            a.action + " " + a.target + ": " + a.outcome);
          var details = form.closest("details");
          if (details) details.open = false;
          form.reset();
          refresh();
        } else {
          flash(false, a.detail || ("refused (" + r.status + ")"));
        }
      });
    }).catch(function () { flash(false, "no answer from the broker: see the audit log for whether it was done"); });
  });

  document.documentElement.classList.add("js");
  connect();
})();
