// The conversation menu's share link: a read-only snapshot of the branch on screen,
// made and revoked through the conversations API (/api/conversations/<id>/shares/).
(function () {
  "use strict";

  const box = document.getElementById("share");
  if (!box || !window.fetch || !window.chatApi) return;
  const notice = chatApi.notice;
  const create = document.getElementById("share-create");
  const linkBox = document.getElementById("share-link");
  const urlInput = document.getElementById("share-url");
  const revoke = document.getElementById("share-revoke");
  const showOwner = document.getElementById("share-show-owner");
  let current = null; // the share made on this page

  function call(url, method, body) {
    return chatApi.send(url, method, body, function (data) {
      return data.detail || "Sharing failed.";
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
