// The conversation menu's organisation: pin, archive or restore, and tags. Each change is
// a PATCH of the conversations API (the browser's session authenticates it); the sidebar
// list is then asked for again (shell.js), so it shows the new order and marks.
(function () {
  "use strict";

  const box = document.getElementById("organise");
  if (!box || !window.fetch || !window.chatApi) return;
  const notice = chatApi.notice;
  const pin = document.getElementById("pin-conversation");
  const archive = document.getElementById("archive-conversation");
  const tagsForm = document.getElementById("tags-form");
  const tagsInput = document.getElementById("tags-input");

  function patch(fields) {
    return chatApi.send(box.dataset.apiUrl, "PATCH", fields, function (body) {
      return chatApi.fieldError(body, "The change was not saved.");
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
