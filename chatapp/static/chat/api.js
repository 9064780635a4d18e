// What the conversation menu's and the replies' controls (organise.js, share.js,
// feedback.js) share: JSON requests to the API, which the browser's session
// authenticates (so Django's CSRF token goes along), and the page's notice line.
(function () {
  "use strict";

  function csrfToken() {
    const field = document.querySelector("input[name=csrfmiddlewaretoken]");
    return field ? field.value : "";
  }

  function notice(text) {
    const el = document.getElementById("notice");
    if (!el) return;
    el.textContent = text;
    el.hidden = !text;
  }

  // The API's 400 names the field; its own message, not a status code, is shown.
  function fieldError(body, fallback) {
    if (body && body.errors) {
      const first = Object.values(body.errors)[0];
      if (first) return [].concat(first).join(" ");
    }
    return (body && body.detail) || fallback;
  }

  // The response's JSON (null for a 204); on an error status, an Error whose message is
  // failed(the error body).
  function send(url, method, body, failed) {
    return fetch(url, {
      method: method,
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRFToken": csrfToken() },
      body: body ? JSON.stringify(body) : undefined,
    }).then(function (r) {
      if (r.status === 204) return null;
      return r.json().catch(function () { return {}; }).then(function (data) {
        if (!r.ok) throw new Error(failed(data));
        return data;
      });
    });
  }

  window.chatApi = { csrfToken: csrfToken, notice: notice, fieldError: fieldError, send: send };
})();
