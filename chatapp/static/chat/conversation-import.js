// The sidebar's import: sends a chosen export file (ChatGPT's conversations.json, Open
// WebUI's JSON export) to the conversations API (/api/conversations/import/) and opens
// the first conversation it made; a refused file's reason is shown as the API gives it.
(function () {
  "use strict";

  const form = document.getElementById("import-form");
  if (!form || !window.fetch || !window.FormData) return;
  const input = document.getElementById("import-file");
  const button = document.getElementById("import-button");
  const errorEl = document.getElementById("import-error");

  function csrfToken() {
    const field = document.querySelector("input[name=csrfmiddlewaretoken]");
    return field ? field.value : "";
  }

  function showError(text) {
    errorEl.textContent = text;
    errorEl.hidden = !text;
  }

  function pageUrl(id) {
    return form.dataset.pageUrl.replace(/0\/$/, id + "/");
  }

  button.addEventListener("click", function () { input.click(); });

  input.addEventListener("change", function () {
    const file = input.files && input.files[0];
    if (!file) return;
    const body = new FormData();
    body.append("file", file);
    showError("");
    button.disabled = true;
    button.textContent = "Importing…";
    fetch(form.dataset.apiUrl, {
      method: "POST",
      credentials: "same-origin",
      headers: { "X-CSRFToken": csrfToken(), Accept: "application/json" },
      body: body,
    }).then(function (r) {
      return r.json().catch(function () { return {}; }).then(function (data) {
        if (!r.ok) throw new Error(data.detail || "The import failed (HTTP " + r.status + ").");
        return data;
      });
    }).then(function (data) {
      window.location.assign(pageUrl(data.conversations[0].id));
    }, function (err) {
      showError(err.message);
    }).finally(function () {
      input.value = "";
      button.disabled = false;
      button.textContent = "Import chats…";
    });
  });
})();
