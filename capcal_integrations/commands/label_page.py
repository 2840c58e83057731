"""The page ``capcal label`` serves: one HTML file, no framework, no request but to its own server. The key comes
from the URL's ``#key=`` (kept for the tab in ``sessionStorage``, then taken out of the address bar); passages are
put in the page as text (``textContent``), never as HTML."""

__all__ = ["PAGE"]

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>capcal label</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body { font: 15px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 60rem; padding: 1rem 1.5rem; color: #222; }
header { display: flex; justify-content: space-between; align-items: baseline; gap: 1rem; }
#progress { color: #555; } #bar { height: 6px; background: #eee; margin: .4rem 0 1rem; }
#bar div { height: 100%; background: #2e7d32; width: 0; }
h1 { font-size: 1.1rem; margin: 0; } h2 { font-size: 1.25rem; margin: .2rem 0 1rem; }
ol { padding: 0; list-style: none; } li { border: 2px solid #ddd; border-radius: 6px; padding: .5rem .75rem;
  margin: .45rem 0; display: flex; gap: .75rem; } li.focus { border-color: #1a5fb4; background: #f3f7fd; }
.grade { min-width: 1.6rem; height: 1.6rem; border-radius: 50%; text-align: center; font-weight: bold;
  line-height: 1.6rem; background: #eee; color: #777; flex: none; }
.g0 { background: #e0e0e0; color: #333; } .g1 { background: #fff3c4; } .g2 { background: #c8e6c9; }
.g3 { background: #2e7d32; color: white; } .title { font-weight: 600; }
#keys { color: #555; font-size: .9rem; } #error { color: #b00020; font-weight: bold; min-height: 1.2rem; }
</style></head>
<body>
<header><h1>capcal label</h1><span id="progress">loading...</span></header>
<div id="bar"><div></div></div>
<div id="keys"><b>0</b> not relevant &middot; <b>1</b> related &middot; <b>2</b> relevant &middot; <b>3</b> answers it
 &middot; <b>&uarr;/&darr;</b> or <b>j/k</b> move &middot; <b>&larr;/&rarr;</b> previous / next question</div>
<div id="error" role="alert"></div>
<h2 id="query"></h2>
<ol id="passages"></ol>
<script>
"use strict";
const saved = sessionStorage.getItem("capcal-label-key");
const hash = new URLSearchParams(location.hash.slice(1)).get("key");
const key = hash || saved;
if (hash) { sessionStorage.setItem("capcal-label-key", hash); history.replaceState(null, "", location.pathname); }
let state = null, question = 0, focus = 0, saving = 0;
const $ = (id) => document.getElementById(id);

async function call(path, body) {
  const response = await fetch(path, {method: body ? "POST" : "GET", body: body ? JSON.stringify(body) : undefined,
    headers: {"Authorization": "Bearer " + key, "Content-Type": "application/json"}});
  const value = await response.json();
  if (!response.ok) throw new Error(value.error || response.statusText);
  return value;
}

function firstUngraded() {
  const i = state.questions.findIndex((q) => q.grades.some((g) => g === null));
  return i < 0 ? 0 : i;
}

function render() {
  const q = state.questions[question], all = state.questions.map((x) => x.grades);
  const graded = all.flat().filter((g) => g !== null).length, passages = all.flat().length;
  const done = all.filter((gs) => !gs.includes(null)).length;
  $("progress").textContent = `question ${question + 1} of ${all.length} \\u00b7 ${done} done \\u00b7 ` +
    `${graded} of ${passages} passages graded \\u00b7 ` + (saving ? `saving ${saving}...` : "all saved");
  $("bar").firstElementChild.style.width = `${100 * graded / Math.max(1, passages)}%`;
  $("query").textContent = q.query;
  const list = $("passages");
  list.replaceChildren();
  q.passages.forEach((passage, j) => {
    const li = document.createElement("li"), badge = document.createElement("span"), text = document.createElement("div");
    const g = q.grades[j];
    badge.className = "grade" + (g === null ? "" : " g" + g);
    badge.textContent = g === null ? "\\u2013" : String(g);
    if (passage.title) {
      const t = document.createElement("div");
      t.className = "title";
      t.textContent = passage.title;
      text.append(t);
    }
    text.append(document.createTextNode(passage.text));
    li.append(badge, text);
    li.className = j === focus ? "focus" : "";
    li.dataset.passage = j;
    li.onclick = () => { focus = j; render(); };
    list.append(li);
  });
  const current = list.children[focus];
  if (current) current.scrollIntoView({block: "nearest"});
}

function move(q, f) {
  question = Math.max(0, Math.min(state.questions.length - 1, q));
  focus = Math.max(0, Math.min(state.questions[question].passages.length - 1, f));
  render();
}

function grade(g) {  // shown at once, saved in the background: a failure puts the old grade back and says so
  const q = question, j = focus, grades = state.questions[q].grades, before = grades[j];
  grades[j] = g;
  saving += 1;
  call("/api/grade", {question: q, passage: j, grade: g})
    .then(() => { $("error").textContent = ""; })
    .catch((err) => { grades[j] = before; $("error").textContent = "not saved: " + err.message; })
    .finally(() => { saving -= 1; render(); });
  const next = grades.findIndex((x, k) => k > j && x === null);
  if (next >= 0) return move(q, next);
  const left = grades.indexOf(null);
  if (left >= 0) return move(q, left);
  if (q + 1 < state.questions.length) return move(q + 1, Math.max(0, state.questions[q + 1].grades.indexOf(null)));
  render();
}

document.addEventListener("keydown", (event) => {
  if (!state || event.ctrlKey || event.metaKey || event.altKey) return;
  if ("0123".includes(event.key) && event.key.length === 1) grade(Number(event.key));
  else if (event.key === "ArrowDown" || event.key === "j") move(question, focus + 1);
  else if (event.key === "ArrowUp" || event.key === "k") move(question, focus - 1);
  else if (event.key === "ArrowRight") move(question + 1, 0);
  else if (event.key === "ArrowLeft") move(question - 1, 0);
  else return;
  event.preventDefault();
});

call("/api/state").then((value) => {
  state = value;
  const q = firstUngraded();
  move(q, Math.max(0, state.questions[q].grades.indexOf(null)));
}).catch((err) => { $("error").textContent = err.message; $("progress").textContent = ""; });
</script>
</body></html>
"""
