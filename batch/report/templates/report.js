(function () {
  'use strict';
  // What the page holds packed (batch/report/render.py `pack`: raw DEFLATE, base64): the body of every question
  // shown closed (script.qz) and each run's passage texts (script.ptexts). Inflated here when first needed.
  function unpack(b64) {
    var bin = atob(b64.trim());
    var bytes = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) { bytes[i] = bin.charCodeAt(i); }
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream('deflate-raw'));
    return new Response(stream).text();
  }
  // A closed question's body goes into the page when it first opens (a click, a link, the index).
  var bodies = new WeakMap();
  function materialize(q) {
    if (!bodies.has(q)) {
      var z = q.querySelector(':scope > script.qz');
      bodies.set(q, !z ? Promise.resolve() : unpack(z.textContent).then(function (html) {
        z.insertAdjacentHTML('afterend', html);  // markup the report rendered and escaped, never a run's raw text
        z.remove();
        q.querySelectorAll('li.passage > details[open]').forEach(fill);
      }));
    }
    return bodies.get(q);
  }
  // A node's passage text lives once in its run's store: put in when the passage opens, as text, never markup.
  var stores = new WeakMap();
  function store(section) {
    if (!stores.has(section)) {
      var script = section.querySelector(':scope > script.ptexts');
      stores.set(section, script ? unpack(script.textContent).then(JSON.parse) : Promise.resolve({}));
    }
    return stores.get(section);
  }
  function fill(d) {
    var p = d.querySelector(':scope > .ptext[data-ptext]');
    var section = d.closest('section.run');
    if (!p || !section || p.hasAttribute('data-filled')) { return; }
    p.setAttribute('data-filled', '');
    store(section).then(function (texts) { p.textContent = texts[p.getAttribute('data-ptext')] || ''; });
  }
  function reveal(el) {
    for (var p = el; p; p = p.parentElement) { if (p.tagName === 'DETAILS') { p.open = true; } }
  }
  function flash(el) {
    var targets = [el];
    var n = el.getAttribute('data-span');
    var box = el.closest('.passage');
    if (n && box) { targets = Array.prototype.slice.call(box.querySelectorAll('mark[data-spans~="' + n + '"]')); }
    targets.forEach(function (t) { t.classList.add('flash'); });
    window.setTimeout(function () { targets.forEach(function (t) { t.classList.remove('flash'); }); }, 1600);
  }
  function show(el) {
    reveal(el);
    el.scrollIntoView({block: 'center'});
    flash(el);
  }
  // The question an id lies in (ids inside a question start with its own, r<run>-q<question>: html.py).
  function questionOf(id) {
    var m = /^(r\d+-q\d+)(-|$)/.exec(id);
    var q = m && document.getElementById(m[1]);
    return q && q.classList.contains('question') ? q : null;
  }
  // Whether `id` is in the page or inside a packed question; then shows it (once its question is in).
  function go(id) {
    var el = document.getElementById(id);
    if (el) { show(el); return true; }
    var q = questionOf(id);
    if (!q) { return false; }
    materialize(q).then(function () { var e = document.getElementById(id); if (e) { show(e); } });
    return true;
  }
  document.addEventListener('click', function (ev) {
    var a = ev.target.closest('a[href^="#"]');
    if (a) {
      var id = decodeURIComponent(a.getAttribute('href').slice(1));
      if (go(id)) { ev.preventDefault(); history.replaceState(null, '', '#' + id); }
      return;
    }
    var b = ev.target.closest('button[data-act]');
    if (b) {
      var open = b.getAttribute('data-act') === 'expand';
      b.closest('.qbody').querySelectorAll('details.node').forEach(function (d) { d.open = open; });
    }
  });
  document.addEventListener('toggle', function (ev) {
    var d = ev.target;
    if (d.tagName !== 'DETAILS' || !d.open) { return; }
    if (d.classList.contains('question')) { materialize(d); } else { fill(d); }
  }, true);
  document.querySelectorAll('li.passage > details[open]').forEach(fill);
  window.addEventListener('hashchange', function () { go(decodeURIComponent(location.hash.slice(1))); });
  if (location.hash.length > 1) { go(decodeURIComponent(location.hash.slice(1))); }
})();
