(function () {
  'use strict';
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
  function go(id) {
    var el = document.getElementById(id);
    if (!el) { return false; }
    reveal(el);
    el.scrollIntoView({block: 'center'});
    flash(el);
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
  // A node's passage text lives once in its run's store (script.ptexts, batch/report/html.py text_store):
  // put it in when the passage opens (a click, "expand all", a link), as text, never markup.
  var stores = new WeakMap();
  function fill(d) {
    var p = d.querySelector(':scope > .ptext[data-ptext]');
    if (!p || p.hasAttribute('data-filled')) { return; }
    var section = d.closest('section.run');
    var script = section && section.querySelector(':scope > script.ptexts');
    if (!script) { return; }
    if (!stores.has(section)) { stores.set(section, JSON.parse(script.textContent)); }
    p.textContent = stores.get(section)[p.getAttribute('data-ptext')] || '';
    p.setAttribute('data-filled', '');
  }
  document.addEventListener('toggle', function (ev) {
    if (ev.target.tagName === 'DETAILS' && ev.target.open) { fill(ev.target); }
  }, true);
  document.querySelectorAll('li.passage > details[open]').forEach(fill);
  window.addEventListener('hashchange', function () { go(decodeURIComponent(location.hash.slice(1))); });
  if (location.hash.length > 1) { go(decodeURIComponent(location.hash.slice(1))); }
})();
