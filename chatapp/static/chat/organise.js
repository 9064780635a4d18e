// The conversation menu's organisation: pin, archive or restore, and tags. Each change is
// a PATCH of the conversations API (the browser's session authenticates it); the sidebar
// list is then asked for again (shell.js), so it shows the new order and marks.
(function () {
  "use strict";

  const box = document.getElementById("organise");
  if (!box || !window.fetch) return;
  const pin = document.getElementById("pin-conversation");
  const archive = document.getElementById("archive-conversation");
  const tagsForm = document.getElementById("tags-form");
  const tagsInput = document.getElementById("tags-input");
  const noticeEl = document.getElementById("notice");

  function csrfToken() {
    const field = document.querySelector("input[name=csrfmiddlewaretoken]");
    return field ? field.value : "";
  }

  function notice(text) {
    if (!noticeEl) return;
    noticeEl.textContent = text;
    noticeEl.hidden = !text;
  }

  // The API's 400 names the field; show its own message, not a status code.
  function errorText(body) {
    if (body && body.errors) {
      const first = Object.values(body.errors)[0];
      if (first) return [].concat(first).join(" ");
    }
    return (body && body.detail) || "The change was not saved.";
  }

  function patch(fields) {
    return fetch(box.dataset.apiUrl, {
      method: "PATCH",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRFToken": csrfToken() },
      body: JSON.stringify(fields),
    }).then(function (r) {
      return r.json().catch(function () { return {}; }).then(function (body) {
        if (!r.ok) throw new Error(errorText(body));
        return body;
      });
    }).then(function (conversation) {
      notice("");
      show(conversation);
      document.dispatchEvent(new CustomEvent("conversation-list:refresh"));
      return conversation;
    }, function (err) { notice(err.message); });
  }

  function show(c) {
    pin.dataset.on = c.pinned ? "1" : "";
    pin.textContent = c.pinned ? "Unpin" : "Pin";
    archive.dataset.on = c.archived ? "1" : "";
    archive.textContent = c.archived ? "Restore" : "Archive";
    tagsInput.value = c.tags.join(", ");
    addFilterChoices(c.tags);
  }

  // A new tag becomes a choice of the sidebar's tag filter at once.
  function addFilterChoices(tags) {
    const select = document.getElementById("tag-filter");
    if (!select) return;
    const have = Array.from(select.options).map(function (o) { return o.value; });
    tags.forEach(function (t) {
      if (have.indexOf(t) < 0) select.append(new Option(t, t));
    });
  }

  pin.addEventListener("click", function () { patch({ pinned: !pin.dataset.on }); });
  archive.addEventListener("click", function () { patch({ archived: !archive.dataset.on }); });
  tagsForm.addEventListener("submit", function (e) {
    e.preventDefault();
    const tags = tagsInput.value.split(",").map(function (t) { return t.trim(); })
      .filter(function (t) { return t; });
    patch({ tags: tags });
  });
})();
