// Thumbs up or down, with an optional comment, on each finished reply. chat.js draws the
// messages (and draws them again on every change), so this adds its controls to each
// reply's footer as it appears; the user's feedback lives in the API
// (/api/conversations/<id>/messages/<id>/feedback/), the page's initial data carries it.
(function () {
  "use strict";

  const messages = document.getElementById("messages");
  const dataEl = document.getElementById("initial-data");
  if (!messages || !dataEl || !window.fetch || !window.chatApi) return;
  const notice = chatApi.notice;
  const initial = JSON.parse(dataEl.textContent);
  const base = "/api/conversations/" + initial.conversation.id + "/messages/";
  const given = initial.feedback || {}; // message id -> {rating, comment}
  const RATED = ["done", "stopped", "interrupted"];

  function send(id, method, body) {
    return chatApi.send(base + id + "/feedback/", method, body, function (data) {
      return chatApi.fieldError(data, "Feedback was not saved.");
    });
  }

  function rate(id, rating, comment) {
    const current = given[id];
    // Pressing the thumb that is already pressed takes the feedback back.
    const request = current && current.rating === rating && comment === undefined
      ? send(id, "DELETE")
      : send(id, "PUT", { rating: rating, comment: comment !== undefined ? comment : (current ? current.comment : "") });
    request.then(function (saved) {
      notice("");
      if (saved) given[id] = saved; else delete given[id];
      refresh();
    }, function (err) { notice(err.message); });
  }

  // Drawn, not emoji: a browser or screenshot without an emoji font shows emoji as boxes.
  const THUMB = '<svg viewBox="0 0 24 24" width="15" height="15" aria-hidden="true">' +
    '<path fill="currentColor" d="M2 10h4v11H2zM8 10l4-7c1.4-.6 2.4.2 2.2 1.8L13.5 9H20' +
    'c1.4 0 2.2 1 1.8 2.3l-2.4 8c-.3 1-1.1 1.7-2.2 1.7H8z"/></svg>';

  function thumb(id, rating, label) {
    const b = document.createElement("button");
    b.type = "button";
    b.className = "link feedback-" + rating;
    b.innerHTML = THUMB;
    if (rating === "down") b.firstChild.style.transform = "rotate(180deg)";
    b.title = label;
    b.setAttribute("aria-label", label);
    b.setAttribute("aria-pressed", given[id] && given[id].rating === rating ? "true" : "false");
    b.addEventListener("click", function () { rate(id, rating); });
    return b;
  }

  function controls(id) {
    const box = document.createElement("span");
    box.className = "feedback";
    box.dataset.rating = given[id] ? given[id].rating : "";
    box.dataset.comment = given[id] ? given[id].comment : "";
    box.append(thumb(id, "up", "Good reply"), thumb(id, "down", "Bad reply"));
    return box;
  }

  // Once rated, a comment box: the comment is saved with the rating.
  function commentForm(id) {
    const form = document.createElement("form");
    form.className = "feedback-comment";
    const input = document.createElement("input");
    input.type = "text";
    input.maxLength = 2000;
    input.placeholder = "Add a comment (optional)";
    input.setAttribute("aria-label", "Feedback comment");
    input.value = given[id].comment || "";
    const save = document.createElement("button");
    save.type = "submit";
    save.className = "link";
    save.textContent = "Save comment";
    form.append(input, save);
    form.addEventListener("submit", function (e) {
      e.preventDefault();
      rate(id, given[id].rating, input.value);
    });
    return form;
  }

  function decorate(article) {
    const id = article.dataset.id;
    const foot = article.querySelector(".msg-foot");
    if (!foot || RATED.indexOf(article.dataset.status) < 0) return;
    const rating = given[id] ? given[id].rating : "";
    const comment = given[id] ? given[id].comment : "";
    const old = foot.querySelector(".feedback");
    if (old && old.dataset.rating === rating && old.dataset.comment === comment) return;
    if (old) old.remove();
    const oldForm = foot.querySelector(".feedback-comment");
    if (oldForm) oldForm.remove();
    foot.append(controls(id));
    if (rating) foot.append(commentForm(id));
  }

  function refresh() {
    messages.querySelectorAll("article.msg.assistant").forEach(decorate);
  }

  new MutationObserver(refresh).observe(messages, { childList: true, subtree: true, attributes: true, attributeFilter: ["data-status"] });
  refresh();
})();
