// hdeval label: the page's behaviour. Plain JavaScript, no build step; the Content-Security-Policy
// allows no inline script, so everything lives here. Every state change is a POST with the
// X-Hdeval header (the server refuses one without it: a cross-site page cannot send it).
"use strict";

function post(path, data) {
  return fetch(path, {
    method: "POST", credentials: "same-origin",
    headers: {"Content-Type": "application/json", "X-Hdeval": "1"},
    body: JSON.stringify(data || {}),
  }).then(function (r) {
    return r.json().catch(function () { return {error: "HTTP " + r.status}; }).then(function (body) {
      if (!r.ok || body.error) { throw new Error(body.error || ("HTTP " + r.status)); }
      return body;
    });
  });
}

function showError(err) {
  var el = document.getElementById("error");
  if (el) { el.textContent = String(err.message || err); }
}

function next() { window.location.assign("/"); }

function setupRater() {
  var form = document.getElementById("rater-form");
  if (!form) { return; }
  form.addEventListener("submit", function (ev) {
    ev.preventDefault();
    post("/api/rater", {name: document.getElementById("rater-name").value}).then(next).catch(showError);
  });
}

function setupLabelling() {
  var sample = document.getElementById("sample");
  var aspects = Array.prototype.slice.call(document.querySelectorAll(".aspect"));
  var values = {};
  var current = 0;
  var busy = false;
  var note = document.getElementById("note");
  var submit = document.getElementById("submit");

  function complete() { return aspects.every(function (a) { return a.dataset.aspect in values; }); }

  function renderScores() {
    aspects.forEach(function (a, i) {
      a.classList.toggle("current", i === current && !complete());
      Array.prototype.forEach.call(a.querySelectorAll(".score"), function (b) {
        b.classList.toggle("chosen", values[a.dataset.aspect] === Number(b.dataset.value));
      });
    });
    if (submit) { submit.disabled = !complete(); }
  }

  function save() {
    if (busy || !sample || !complete()) { return; }
    busy = true;
    post("/api/label", {sample_id: sample.dataset.sampleId, values: values, note: note ? note.value : ""})
      .then(next).catch(function (e) { busy = false; showError(e); });
  }

  // a pairwise task: one choice (a, b or tie) per pair, saved at once
  var pairwise = document.getElementById("aspects") && document.getElementById("aspects").dataset.shape === "pairwise";

  function render() {
    if (pairwise) {
      Array.prototype.forEach.call(document.querySelectorAll(".score"), function (b) {
        b.classList.toggle("chosen", values.label === b.dataset.choice);
      });
      if (submit) { submit.disabled = !complete(); }
      return;
    }
    renderScores();
  }

  function pick(choice) {
    if (!pairwise || !sample) { return; }
    values.label = choice;
    render();
    save();
  }

  function choose(i, value) {
    var a = aspects[i];
    if (!a || value < Number(a.dataset.low) || value > Number(a.dataset.high)) { return; }
    values[a.dataset.aspect] = value;
    var open = aspects.findIndex(function (x) { return !(x.dataset.aspect in values); });
    current = open < 0 ? i : open;
    render();
    if (open < 0) { save(); }
  }

  function skip() {
    if (busy || !sample) { return; }
    busy = true;
    post("/api/skip", {sample_id: sample.dataset.sampleId}).then(next)
      .catch(function (e) { busy = false; showError(e); });
  }

  function undo() {
    if (busy) { return; }
    busy = true;
    post("/api/undo", {}).then(next).catch(function (e) { busy = false; showError(e); });
  }

  aspects.forEach(function (a, i) {
    Array.prototype.forEach.call(a.querySelectorAll(".score"), function (b) {
      b.addEventListener("click", function () {
        if (pairwise) { pick(b.dataset.choice); } else { current = i; choose(i, Number(b.dataset.value)); }
      });
    });
  });
  if (submit) { submit.addEventListener("click", save); }
  var skipButton = document.getElementById("skip");
  if (skipButton) { skipButton.addEventListener("click", skip); }
  var undoButton = document.getElementById("undo");
  if (undoButton) { undoButton.addEventListener("click", undo); }
  var change = document.getElementById("change-rater");
  if (change) {
    change.addEventListener("click", function () {
      var name = window.prompt("Your name");
      if (name) { post("/api/rater", {name: name}).then(next).catch(showError); }
    });
  }

  document.addEventListener("keydown", function (ev) {
    if (ev.ctrlKey || ev.metaKey || ev.altKey) { return; }
    var typing = ev.target && (ev.target.tagName === "TEXTAREA" || ev.target.tagName === "INPUT");
    if (typing) {
      if (ev.key === "Escape") { ev.target.blur(); }
      return;
    }
    if (pairwise && (ev.key === "a" || ev.key === "b" || ev.key === "t")) {
      ev.preventDefault(); pick(ev.key === "t" ? "tie" : ev.key);
    }
    else if (!pairwise && /^[0-9]$/.test(ev.key)) { ev.preventDefault(); choose(current, Number(ev.key)); }
    else if (ev.key === "s") { ev.preventDefault(); skip(); }
    else if (ev.key === "u") { ev.preventDefault(); undo(); }
    else if (ev.key === "n" && note) { ev.preventDefault(); note.focus(); }
    else if (ev.key === "Enter") { ev.preventDefault(); save(); }
  });
  render();
}

function pollPanel() {
  var panel = document.getElementById("panel");
  if (!panel) { return; }
  var waiting = document.getElementById("waiting");
  window.setInterval(function () {
    if (waiting && waiting.dataset.wait === "scoring") {
      fetch("/api/state", {credentials: "same-origin"}).then(function (r) { return r.json(); })
        .then(function (s) { if (s.scored > 0 && s.scoring !== "failed") { next(); } });
      return;
    }
    fetch("/panel", {credentials: "same-origin"}).then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) { if (html !== null) { panel.innerHTML = html; } });
  }, 2000);
}

document.addEventListener("DOMContentLoaded", function () {
  setupRater();
  if (document.getElementById("aspects") || document.getElementById("waiting")) { setupLabelling(); }
  pollPanel();
});
