// The chat page: a message tree kept in sync over one WebSocket.
// Model output is untrusted: Markdown is rendered by marked, then sanitized by
// DOMPurify before it touches the DOM; user text is only ever set as textContent.
(function () {
  "use strict";

  const initial = JSON.parse(document.getElementById("initial-data").textContent);
  const conversationId = initial.conversation.id;
  const $messages = document.getElementById("messages");
  const $input = document.getElementById("input");
  const $send = document.getElementById("send");
  const $stop = document.getElementById("stop");
  const $composer = document.getElementById("composer");
  const $notice = document.getElementById("notice");
  const $connection = document.getElementById("connection");
  const $title = document.getElementById("conversation-title");

  const ROOT = "root";
  const messages = new Map(); // id -> message dict (as the server sends it)
  const children = new Map(); // parent id or ROOT -> [child ids], oldest first
  const selected = new Map(); // parent id or ROOT -> the child shown
  const streams = new Map(); // reply id -> {seq, text, gap}
  let editing = null; // id of the user message being edited
  let socket = null;
  let retry = 0;

  // --- Markdown, safely ---------------------------------------------------
  const markedParse = (window.marked && (window.marked.parse || window.marked.marked)) || null;
  if (window.hljs) window.hljs.configure({ ignoreUnescapedHTML: true });
  if (window.DOMPurify) {
    window.DOMPurify.addHook("afterSanitizeAttributes", function (node) {
      if (node.tagName === "A") {
        node.setAttribute("target", "_blank");
        node.setAttribute("rel", "noopener noreferrer nofollow");
      }
    });
  }

  // A reply that is one JSON value (a structured output), or that holds tool calls, reads
  // better as highlighted, indented JSON than as a paragraph.
  function structured(text) {
    const trimmed = text.trim();
    if (/^[[{]/.test(trimmed)) {
      try {
        return "```json\n" + JSON.stringify(JSON.parse(trimmed), null, 2) + "\n```";
      } catch (e) { /* not JSON (yet, while streaming): as written */ }
    }
    return text.replace(/<tool_call>\s*([\s\S]*?)\s*<\/tool_call>/g, function (all, body) {
      try {
        return "\n**Tool call**\n\n```json\n" + JSON.stringify(JSON.parse(body), null, 2) + "\n```\n";
      } catch (e) { return all; }
    });
  }

  function renderMarkdown(el, text) {
    if (!markedParse || !window.DOMPurify) {
      el.textContent = text; // no renderer: plain text is always safe
      return;
    }
    const html = markedParse(structured(text), { gfm: true, breaks: true });
    el.innerHTML = window.DOMPurify.sanitize(html, {
      USE_PROFILES: { html: true },
      FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select"],
    });
    if (window.hljs) {
      el.querySelectorAll("pre code").forEach(function (block) {
        window.hljs.highlightElement(block);
      });
    }
    // Added after sanitizing (DOMPurify drops buttons): ours, not the model's.
    el.querySelectorAll("pre").forEach(function (pre) {
      const wrap = document.createElement("div");
      wrap.className = "code-block";
      pre.replaceWith(wrap);
      const copy = button("Copy", "copy-code", function () { copyText(pre.textContent.replace(/\n$/, ""), copy); });
      copy.setAttribute("aria-label", "Copy code");
      wrap.append(pre, copy);
    });
  }

  // --- copying --------------------------------------------------------------
  // The Clipboard API needs a secure context (https or localhost); a server reached
  // over plain http by its address gets the older execCommand path.
  function copyText(text, btn) {
    function shown(label) {
      const before = btn.dataset.label || btn.textContent;
      btn.dataset.label = before;
      btn.textContent = label;
      setTimeout(function () { btn.textContent = before; }, 1500);
    }
    function fallback() {
      const area = document.createElement("textarea");
      area.value = text;
      area.setAttribute("readonly", "");
      area.style.position = "fixed";
      area.style.opacity = "0";
      document.body.append(area);
      area.select();
      let ok = false;
      try { ok = document.execCommand("copy"); } catch (err) { ok = false; }
      area.remove();
      shown(ok ? "Copied" : "Copy failed");
    }
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(function () { shown("Copied"); }, fallback);
    } else {
      fallback();
    }
  }

  // --- time -------------------------------------------------------------------
  // In the browser's locale and time zone: today's messages show the time, older
  // ones the date too; the full date and time is in the tooltip.
  const timeOnly = new Intl.DateTimeFormat(undefined, { timeStyle: "short" });
  const dateAndTime = new Intl.DateTimeFormat(undefined, { dateStyle: "medium", timeStyle: "short" });
  const fullDate = new Intl.DateTimeFormat(undefined, { dateStyle: "full", timeStyle: "medium" });

  function timeElement(iso) {
    const when = new Date(iso);
    if (!iso || isNaN(when)) return null;
    const el = document.createElement("time");
    el.className = "msg-time";
    el.dateTime = iso;
    const today = new Date().toDateString() === when.toDateString();
    el.textContent = (today ? timeOnly : dateAndTime).format(when);
    el.title = fullDate.format(when);
    return el;
  }

  // --- the tree -----------------------------------------------------------
  function key(parentId) {
    return parentId === null || parentId === undefined ? ROOT : parentId;
  }

  function upsert(msg) {
    const known = messages.has(msg.id);
    messages.set(msg.id, msg);
    if (!known) {
      const k = key(msg.parent_id);
      if (!children.has(k)) children.set(k, []);
      const list = children.get(k);
      list.push(msg.id);
      list.sort(function (a, b) { return a - b; });
    }
  }

  function selectPathTo(id) {
    // Show the branch that ends in message `id`.
    let msg = messages.get(id);
    while (msg) {
      selected.set(key(msg.parent_id), msg.id);
      msg = msg.parent_id === null ? null : messages.get(msg.parent_id);
    }
  }

  function visiblePath() {
    const path = [];
    let k = ROOT;
    while (children.has(k) && children.get(k).length) {
      const list = children.get(k);
      let id = selected.get(k);
      if (!list.includes(id)) id = list[list.length - 1];
      path.push(messages.get(id));
      k = id;
    }
    return path;
  }

  function isActive(m) {
    return m.role === "assistant" && (m.status === "pending" || m.status === "streaming");
  }

  function activeReplies() {
    return Array.from(messages.values()).filter(isActive);
  }

  // --- rendering ----------------------------------------------------------
  function usageLine(msg) {
    const u = msg.usage;
    if (!u) return "";
    const parts = [
      "prompt " + u.prompt_tokens,
      "cached " + u.cached_tokens,
      "completion " + u.completion_tokens,
    ];
    if (u.ttft_ms !== null && u.ttft_ms !== undefined) parts.push("TTFT " + Math.round(u.ttft_ms) + " ms");
    const receipt = receiptText(u.prefix_cache);
    if (receipt) parts.push(receipt);
    return parts.join(" · ");
  }

  // Why the prefix-cache match ended where it did (the reply's cache receipt).
  function receiptText(r) {
    if (!r) return "";
    let text = "cache " + r.reason;
    if (r.reason === "evicted" && r.evicted_from) text += " from " + r.evicted_from;
    if (r.reason === "diverged") {
      text += " at token " + r.diverged_at + " (" + r.diverged_segment;
      if (r.diverged_message_id) text += " #" + r.diverged_message_id;
      text += ")";
    }
    if (r.tier_tokens) text += ", " + r.tier_tokens + " restored";
    // The chat's settings changed since its previous reply: why this prompt was new.
    if (r.changed && r.changed.length) text += " (" + r.changed.join(", ") + " changed)";
    const cut = r.history_cut;
    if (cut && cut.new) {
      text += " · history cut at turn " + cut.turns + ": " + cut.tokens.toLocaleString("en") +
        " tokens left out";
    }
    return text;
  }

  // The first message the model still sees on this path: the latest reply that left
  // out earlier turns names it.
  function firstSeenId(path) {
    for (let i = path.length - 1; i >= 0; i--) {
      const u = path[i].usage;
      const cut = u && u.prefix_cache && u.prefix_cache.history_cut;
      if (cut) return cut.first_message_id;
    }
    return null;
  }

  function cutDivider() {
    const el = document.createElement("div");
    el.className = "history-cut";
    el.setAttribute("role", "separator");
    el.textContent = "The assistant no longer sees the messages above";
    return el;
  }

  function button(label, cls, onClick) {
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = label;
    b.className = cls;
    b.addEventListener("click", onClick);
    return b;
  }

  function siblingNav(msg) {
    const list = children.get(key(msg.parent_id)) || [];
    if (list.length < 2) return null;
    const at = list.indexOf(msg.id);
    const nav = document.createElement("span");
    nav.className = "siblings";
    const prev = button("‹", "link sibling-prev", function () { switchTo(list[at - 1]); });
    const next = button("›", "link sibling-next", function () { switchTo(list[at + 1]); });
    prev.disabled = at <= 0;
    next.disabled = at >= list.length - 1;
    prev.setAttribute("aria-label", "Previous version");
    next.setAttribute("aria-label", "Next version");
    const label = document.createElement("span");
    label.className = "sibling-label";
    label.textContent = at + 1 + " / " + list.length;
    nav.append(prev, label, next);
    return nav;
  }

  function switchTo(id) {
    if (id === undefined) return;
    selected.set(key(messages.get(id).parent_id), id);
    render();
    const path = visiblePath();
    if (path.length) send({ type: "select", message_id: path[path.length - 1].id });
  }

  function messageBody(msg) {
    const body = document.createElement("div");
    body.className = "msg-body";
    if (msg.role === "user") {
      body.classList.add("plain");
      body.textContent = msg.content;
    } else {
      body.classList.add("markdown");
      const stream = streams.get(msg.id);
      const text = stream && (msg.status === "pending" || msg.status === "streaming")
        ? stream.text : msg.content;
      renderMarkdown(body, text);
      if (msg.status === "pending" && !text) body.innerHTML = '<span class="typing">…</span>';
    }
    return body;
  }

  function editor(msg) {
    const form = document.createElement("form");
    form.className = "edit-form";
    const area = document.createElement("textarea");
    area.value = msg.content;
    area.rows = Math.min(10, Math.max(2, msg.content.split("\n").length));
    const save = document.createElement("button");
    save.type = "submit";
    save.className = "primary";
    save.textContent = "Save & send";
    const cancel = button("Cancel", "", function () { editing = null; render(); });
    form.append(area, save, cancel);
    form.addEventListener("submit", function (e) {
      e.preventDefault();
      if (!area.value.trim()) return;
      if (send({ type: "edit", message_id: msg.id, content: area.value })) {
        editing = null;
        render();
      }
    });
    area.addEventListener("keydown", function (e) {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        form.requestSubmit();
      } else if (e.key === "Escape") {
        editing = null;
        render();
      }
    });
    setTimeout(function () { area.focus(); }, 0);
    return form;
  }

  function messageElement(msg) {
    const el = document.createElement("article");
    el.className = "msg " + msg.role + " status-" + msg.status;
    el.dataset.id = msg.id;
    el.dataset.status = msg.status;

    const head = document.createElement("div");
    head.className = "msg-head";
    const role = document.createElement("span");
    role.className = "role";
    role.textContent = msg.role === "user" ? "You" : "Assistant";
    head.append(role);
    const time = timeElement(msg.created_at);
    if (time) head.append(time);
    const nav = siblingNav(msg);
    if (nav) head.append(nav);
    el.append(head);

    el.append(editing === msg.id ? editor(msg) : messageBody(msg));

    const foot = document.createElement("div");
    foot.className = "msg-foot";
    if (msg.status === "error") {
      const err = document.createElement("div");
      err.className = "msg-error";
      err.setAttribute("role", "alert");
      err.textContent = "Generation failed: " + (msg.error || "unknown error");
      foot.append(err);
    } else if (msg.status === "stopped" || msg.status === "interrupted") {
      const note = document.createElement("span");
      note.className = "stopped-note";
      note.textContent = msg.status === "interrupted"
        ? "interrupted: the server stopped while writing this" : "stopped";
      foot.append(note);
    }
    const usage = usageLine(msg);
    if (usage) {
      const u = document.createElement("span");
      u.className = "usage";
      u.textContent = usage;
      u.title = "Prompt tokens · of which served from the prefix cache · generated tokens · time to first token";
      foot.append(u);
    }
    if (msg.role === "assistant" && msg.content && !msg.status.match(/pending|streaming/)) {
      // The raw Markdown, as the model wrote it.
      const copy = button("Copy", "link copy-reply", function () { copyText(msg.content, copy); });
      copy.setAttribute("aria-label", "Copy reply");
      foot.append(copy);
    }
    const busy = activeReplies().length > 0;
    if (!busy && editing === null) {
      if (msg.role === "assistant" && !msg.status.match(/pending|streaming/)) {
        foot.append(button("Regenerate", "link regenerate", function () {
          send({ type: "regenerate", message_id: msg.id });
        }));
        if (msg.can_continue) {
          foot.append(button("Continue", "link continue", function () {
            send({ type: "continue", message_id: msg.id });
          }));
        }
      }
      if (msg.role === "user") {
        foot.append(button("Edit", "link edit", function () { editing = msg.id; render(); }));
      }
    }
    el.append(foot);
    return el;
  }

  function render() {
    const atBottom = $messages.scrollHeight - $messages.scrollTop - $messages.clientHeight < 80;
    const path = visiblePath();
    const seen = firstSeenId(path);
    $messages.replaceChildren.apply($messages, path.flatMap(function (msg) {
      const el = messageElement(msg);
      return msg.id === seen ? [cutDivider(), el] : [el];
    }));
    if (!$messages.children.length) {
      const empty = document.createElement("p");
      empty.className = "empty-chat";
      empty.textContent = "Send a message to start.";
      $messages.append(empty);
    }
    const busy = activeReplies().length > 0;
    $stop.hidden = !busy;
    $send.hidden = busy;
    if (atBottom) $messages.scrollTop = $messages.scrollHeight;
  }

  // Streaming updates only touch the reply's body, once per animation frame.
  const dirty = new Set();
  let frame = 0;
  function renderStream(id) {
    dirty.add(id);
    if (frame) return;
    frame = requestAnimationFrame(function () {
      frame = 0;
      dirty.forEach(function (rid) {
        const el = $messages.querySelector('article[data-id="' + rid + '"] .msg-body');
        const stream = streams.get(rid);
        if (el && stream) renderMarkdown(el, stream.text);
      });
      dirty.clear();
      $messages.scrollTop = $messages.scrollHeight;
    });
  }

  function notice(text) {
    $notice.textContent = text;
    $notice.hidden = !text;
  }

  // --- the socket ---------------------------------------------------------
  function send(event) {
    if (!socket || socket.readyState !== WebSocket.OPEN) {
      notice("Not connected to the server; reconnecting…");
      return false;
    }
    notice("");
    socket.send(JSON.stringify(event));
    return true;
  }

  async function resync() {
    // Reload the stored tree (after a reconnect, or a gap in a reply's sequence numbers).
    const res = await fetch("/c/" + conversationId + "/messages.json", { credentials: "same-origin" });
    if (!res.ok) return;
    const data = await res.json();
    data.messages.forEach(function (m) {
      const mine = messages.get(m.id);
      // A response older than a message.done already shown must not revive the reply.
      if (mine && isActive(m) && !isActive(mine)) return;
      upsert(m);
    });
    render();
  }

  let resyncTimer = 0;
  function resyncSoon() {
    if (!resyncTimer) resyncTimer = setTimeout(function () { resyncTimer = 0; resync(); }, 1000);
  }

  function showTitle(title) {
    $title.textContent = title;
    document.title = title + " · PrefixChat";
    // The list entry's label only: its pin mark and tags stay.
    const link = document.querySelector('[data-conversation-id="' + conversationId + '"]');
    const label = link && (link.querySelector(".title") || link);
    if (label) label.textContent = title;
  }

  const handlers = {
    // A reply may have ended between this page's load and its socket's opening.
    hello: function () { if (retry > 0 || activeReplies().length) resync(); retry = 0; },
    "message.created": function (e) {
      upsert(e.message);
      selectPathTo(e.message.id);
      render();
    },
    "message.started": function (e) {
      const m = messages.get(e.message_id);
      if (m) { m.status = "streaming"; }
      // A continued reply streams on after the text it holds.
      streams.set(e.message_id, { seq: 0, text: e.text || "", gap: false });
      render();
    },
    // A page opened mid-reply: the text up to delta `seq`; the stream goes on after it.
    "message.resumed": function (e) {
      const m = messages.get(e.message_id);
      if (m && m.status === "pending") { m.status = "streaming"; }
      streams.set(e.message_id, { seq: e.seq, text: e.text, gap: false });
      render();
    },
    "message.delta": function (e) {
      let s = streams.get(e.message_id);
      if (!s && e.seq > 1) {
        // Mid-reply with no text to go on from (a worker's reply): the stored text, as
        // its heartbeat writes it, until message.done brings the whole.
        resyncSoon();
        return;
      }
      if (!s) { s = { seq: 0, text: "", gap: false }; streams.set(e.message_id, s); }
      if (e.seq <= s.seq) return; // in the text message.resumed gave already
      if (e.seq !== s.seq + 1) s.gap = true;
      s.seq = e.seq;
      s.text += e.text;
      const m = messages.get(e.message_id);
      if (m && m.status === "pending") { m.status = "streaming"; render(); }
      renderStream(e.message_id);
    },
    "message.done": function (e) {
      streams.delete(e.message_id);
      upsert(e.message);
      messages.set(e.message.id, e.message);
      render();
    },
    "conversation.updated": function (e) { showTitle(e.conversation.title || "New conversation"); },
    // The title the model wrote after the first reply (dropped server-side if renamed).
    "conversation.title": function (e) { showTitle(e.title); },
    error: function (e) { notice(e.message); },
    pong: function () {},
  };

  function connect() {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    socket = new WebSocket(scheme + location.host + "/ws/chat/" + conversationId + "/");
    $connection.dataset.state = "connecting";
    $connection.textContent = "connecting…";
    socket.addEventListener("open", function () {
      $connection.dataset.state = "open";
      $connection.textContent = "connected";
      notice("");
    });
    socket.addEventListener("message", function (msg) {
      let event;
      try { event = JSON.parse(msg.data); } catch (err) { return; }
      const handler = handlers[event.type];
      if (handler) handler(event);
    });
    socket.addEventListener("close", function (e) {
      $connection.dataset.state = "closed";
      if (e.code === 4401) {
        $connection.textContent = "logged out";
        notice("Your session has ended. Log in again to continue.");
        return;
      }
      if (e.code === 4404) {
        $connection.textContent = "not found";
        notice("This conversation no longer exists.");
        return;
      }
      $connection.textContent = "reconnecting…";
      retry += 1;
      setTimeout(connect, Math.min(10000, 500 * Math.pow(2, retry)));
    });
  }

  // --- the composer -------------------------------------------------------
  $composer.addEventListener("submit", function (e) {
    e.preventDefault();
    const text = $input.value;
    if (!text.trim() || activeReplies().length) return;
    const path = visiblePath();
    const last = path[path.length - 1];
    const event = { type: "send", content: text };
    if (last) event.parent_id = last.id;
    if (send(event)) $input.value = "";
  });
  $input.addEventListener("keydown", function (e) {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $composer.requestSubmit();
    }
  });
  $stop.addEventListener("click", function () {
    send({ type: "stop" });
  });

  initial.messages.forEach(upsert);
  if (initial.conversation.current_leaf_id) selectPathTo(initial.conversation.current_leaf_id);
  render();
  connect();
  $input.focus();
})();
