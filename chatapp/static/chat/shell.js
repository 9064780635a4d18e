// What every page around the chat needs: the colour theme, the conversation drawer on
// narrow screens and the live search of the conversation list. chat.js (the message
// tree) only runs with a conversation open; this runs on every page.
(function () {
  "use strict";

  // --- theme ---------------------------------------------------------------
  // No stored choice: follow the system (prefers-color-scheme). A toggle stores
  // "light" or "dark" in localStorage. Runs from <head>, before the first paint.
  const THEME_KEY = "prefixchat-theme";
  const systemDark = window.matchMedia ? window.matchMedia("(prefers-color-scheme: dark)") : null;
  const root = document.documentElement;

  let chosen = null;
  try { chosen = localStorage.getItem(THEME_KEY); } catch (err) { /* storage switched off */ }

  function effectiveTheme() {
    if (chosen === "light" || chosen === "dark") return chosen;
    return systemDark && systemDark.matches ? "dark" : "light";
  }

  function applyTheme() {
    const theme = effectiveTheme();
    root.dataset.theme = theme; // chat.css sets color-scheme from this
    document.querySelectorAll(".theme-toggle").forEach(function (b) {
      b.setAttribute("aria-pressed", theme === "dark" ? "true" : "false");
    });
  }

  applyTheme();
  if (systemDark && systemDark.addEventListener) systemDark.addEventListener("change", applyTheme);

  function setUp() {
    applyTheme();
    document.querySelectorAll(".theme-toggle").forEach(function (b) {
      b.addEventListener("click", function () {
        chosen = effectiveTheme() === "dark" ? "light" : "dark";
        try { localStorage.setItem(THEME_KEY, chosen); } catch (err) { /* switched, not remembered */ }
        applyTheme();
      });
    });
    setUpDrawer();
    setUpSearch();
  }

  // --- the drawer (narrow screens) ---------------------------------------
  function setUpDrawer() {
    const sidebar = document.getElementById("sidebar");
    const backdrop = document.getElementById("drawer-backdrop");
    const menuButtons = document.querySelectorAll(".menu-button");
    if (!sidebar || !menuButtons.length) return;
    let opener = null;

    function setOpen(open) {
      document.body.classList.toggle("drawer-open", open);
      if (backdrop) backdrop.hidden = !open;
      menuButtons.forEach(function (b) { b.setAttribute("aria-expanded", open ? "true" : "false"); });
      if (open) {
        opener = document.activeElement;
        const first = document.getElementById("search") || sidebar.querySelector("button, a, input, select");
        // After the slide-in starts: a hidden element cannot take focus.
        requestAnimationFrame(function () { if (first) first.focus(); });
      } else if (opener && opener.focus) {
        opener.focus();
        opener = null;
      }
    }

    menuButtons.forEach(function (b) {
      b.addEventListener("click", function () { setOpen(!document.body.classList.contains("drawer-open")); });
    });
    const close = document.getElementById("drawer-close");
    if (close) close.addEventListener("click", function () { setOpen(false); });
    if (backdrop) backdrop.addEventListener("click", function () { setOpen(false); });
    document.addEventListener("keydown", function (e) {
      if (e.key === "Escape" && document.body.classList.contains("drawer-open")) setOpen(false);
    });
  }

  // --- live search ---------------------------------------------------------
  // The server filters (titles and message text), so each change asks it again:
  // debounced, and a newer query cancels the one in flight.
  const SEARCH_DEBOUNCE_MS = 250;

  function setUpSearch() {
    const input = document.getElementById("search");
    const list = document.getElementById("conversation-list");
    if (!input || !list || !input.form || !input.form.dataset.listUrl || !window.fetch) return;
    const nav = list.closest("nav");
    let timer = 0;
    let inflight = null;
    // The form's search text and filters (tag, archived) as the list's query string.
    function query() {
      const params = new URLSearchParams();
      new FormData(input.form).forEach(function (value, name) {
        if (String(value).trim()) params.set(name, String(value).trim());
      });
      return params.toString();
    }
    let shown = query();

    function markCurrent() {
      const current = nav && nav.dataset.current;
      if (!current) return;
      const link = list.querySelector('[data-conversation-id="' + current + '"]');
      if (link) link.parentElement.classList.add("current");
    }

    function search() {
      const q = input.value.trim();
      const qs = query();
      if (qs === shown) return;
      if (inflight) inflight.abort();
      inflight = window.AbortController ? new AbortController() : null;
      const url = input.form.dataset.listUrl + (qs ? "?" + qs : "");
      fetch(url, { credentials: "same-origin", signal: inflight && inflight.signal })
        .then(function (r) {
          if (!r.ok) throw new Error("HTTP " + r.status);
          return r.text();
        })
        .then(function (html) {
          list.innerHTML = html; // our own template's output, autoescaped
          markCurrent();
          shown = qs;
          list.dataset.query = q; // lets a test wait for this query's answer
          list.dataset.filters = qs;
          // A reload (or the back button) shows the same filtered list.
          const here = new URL(location.href);
          here.search = qs;
          history.replaceState(history.state, "", here);
        })
        .catch(function (err) {
          if (err.name !== "AbortError") console.warn("conversation search failed", err);
        });
    }

    input.addEventListener("input", function () {
      clearTimeout(timer);
      timer = setTimeout(search, SEARCH_DEBOUNCE_MS);
    });
    // A filter applies at once; organise.js asks for the list again after a change.
    input.form.addEventListener("change", function (e) {
      if (e.target !== input) { clearTimeout(timer); search(); }
    });
    document.addEventListener("conversation-list:refresh", function () { shown = null; search(); });
    input.form.addEventListener("submit", function (e) {
      e.preventDefault(); // Enter searches at once, without a page load
      clearTimeout(timer);
      search();
    });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", setUp);
  else setUp();
})();
