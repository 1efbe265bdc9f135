// Flint's pages: the login (the token from the address's #token= fragment or the form, sent
// once in a POST body; the server answers with a cookie, so no address ever holds the token)
// and, on a page, its live parts: every REFRESH_MS the page's own tables are fetched again and
// swapped in, and the charts and the timeline are drawn from the JSON API (/api/v1/...).
"use strict";

(function () {
  const REFRESH_MS = 2000;

  function login(form) {
    form.next.value = location.pathname + location.search;
    const match = location.hash.match(/[#&]token=([^&]*)/);
    if (!match) {
      return;
    }
    // Out of the address bar and the history before anything else.
    history.replaceState(null, "", location.pathname + location.search);
    const body = new URLSearchParams({ token: decodeURIComponent(match[1]), next: form.next.value });
    fetch("/login", { method: "POST", body: body, credentials: "same-origin" }).then((r) => {
      if (r.ok && r.redirected) {
        location.replace(form.next.value);
      } else {
        document.getElementById("login-error").textContent = "That token was refused.";
      }
    });
  }

  // Swaps the parts of the page marked data-live for the same parts of a fresh copy.
  function refreshParts() {
    fetch(location.pathname + location.search, { credentials: "same-origin" })
      .then((r) => (r.ok ? r.text() : Promise.reject(r.status)))
      .then((html) => {
        const fresh = new DOMParser().parseFromString(html, "text/html");
        for (const part of document.querySelectorAll("[data-live]")) {
          const next = fresh.getElementById(part.id);
          if (next) {
            part.replaceWith(document.importNode(next, true));
          }
        }
        const stamp = document.getElementById("updated");
        if (stamp) {
          stamp.textContent = new Date().toLocaleTimeString();
        }
      })
      .catch(() => {});
  }

  window.flint = window.flint || {};
  window.flint.refreshParts = refreshParts;

  document.addEventListener("DOMContentLoaded", () => {
    const form = document.getElementById("login");
    if (form) {
      login(form);
      return;
    }
    setInterval(() => {
      refreshParts();
      if (window.flint.draw) {
        window.flint.draw();
      }
    }, REFRESH_MS);
    if (window.flint.draw) {
      window.flint.draw();
    }
  });
})();
