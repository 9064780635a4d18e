// The conversation menu's share link: a read-only snapshot of the branch on screen,
// made and revoked through the conversations API (/api/conversations/<id>/shares/).
(function () {
  "use strict";

  const box = document.getElementById("share");
  if (!box || !window.fetch) return;
  const create = document.getElementById("share-create");
  const linkBox = document.getElementById("share-link");
  const urlInput = document.getElementById("share-url");
  const revoke = document.getElementById("share-revoke");
  const showOwner = document.getElementById("share-show-owner");
  const noticeEl = document.getElementById("notice");
  let current = null; // the share made on this page

  function csrfToken() {
    const field = document.querySelector("input[name=csrfmiddlewaretoken]");
    return field ? field.value : "";
  }

  function notice(text) {
    if (!noticeEl) return;
    noticeEl.textContent = text;
    noticeEl.hidden = !text;
  }

  function call(url, method, body) {
    return fetch(url, {
      method: method,
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRFToken": csrfToken() },
      body: body ? JSON.stringify(body) : undefined,
    }).then(function (r) {
      if (r.status === 204) return null;
      return r.json().catch(function () { return {}; }).then(function (data) {
        if (!r.ok) throw new Error(data.detail || "Sharing failed.");
        return data;
      });
    });
  }

  // The branch on screen ends at the last message drawn.
  function leafId() {
    const shown = document.querySelectorAll("#messages article.msg");
    return shown.length ? Number(shown[shown.length - 1].dataset.id) : null;
  }

  create.addEventListener("click", function () {
    call(box.dataset.apiUrl, "POST", { message_id: leafId(), show_owner: showOwner.checked })
      .then(function (share) {
        notice("");
        current = share;
        urlInput.value = share.url;
        linkBox.hidden = false;
        urlInput.select();
      }, function (err) { notice(err.message); });
  });

  revoke.addEventListener("click", function () {
    if (!current) return;
    call(box.dataset.apiUrl + current.id + "/", "DELETE").then(function () {
      notice("");
      current = null;
      urlInput.value = "";
      linkBox.hidden = true;
    }, function (err) { notice(err.message); });
  });
})();
