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
  window.addEventListener('hashchange', function () { go(decodeURIComponent(location.hash.slice(1))); });
  if (location.hash.length > 1) { go(decodeURIComponent(location.hash.slice(1))); }
})();
