// The chat's settings panel: system prompt, temperature, top_p, reply length and model,
// saved through the conversations API (they apply from the next message), and "Save as
// preset", which the new-chat picker then offers. User text is only ever set as values.
(function () {
  "use strict";

  const dataEl = document.getElementById("settings-panel-data");
  const $form = document.getElementById("settings-form");
  if (!dataEl || !$form) return;
  const data = JSON.parse(dataEl.textContent);
  if (!data) return;

  const $system = document.getElementById("setting-system-prompt");
  const $temperature = document.getElementById("setting-temperature");
  const $topP = document.getElementById("setting-top-p");
  const $maxTokens = document.getElementById("setting-max-new-tokens");
  const $model = document.getElementById("setting-model");
  const $status = document.getElementById("settings-status");
  const $presetName = document.getElementById("preset-name");
  const $presetSave = document.getElementById("preset-save");
  const $presetBadge = document.getElementById("conversation-preset");
  const $modelBadge = document.getElementById("conversation-model");
  const settingsUrl = "/api/conversations/" + data.conversation_id + "/settings/";

  function csrfToken() {
    const input = document.querySelector('input[name="csrfmiddlewaretoken"]');
    return input ? input.value : "";
  }

  function status(text, isError) {
    $status.textContent = text;
    $status.classList.toggle("error", Boolean(isError));
  }

  function numberOrNull(input) {
    return input.value.trim() === "" ? null : Number(input.value);
  }

  function show(s) {
    $system.value = s.system_prompt || "";
    // The preset's own text shows where the chat has none of its own.
    $system.placeholder = data.preset_text || "The preset's prompt";
    $temperature.value = s.temperature === null || s.temperature === undefined ? "" : s.temperature;
    $topP.value = s.top_p === null || s.top_p === undefined ? "" : s.top_p;
    $maxTokens.value = s.max_new_tokens === null || s.max_new_tokens === undefined ? "" : s.max_new_tokens;
    if (s.model) $model.value = s.model;
    $temperature.placeholder = "default " + data.defaults.temperature;
    $topP.placeholder = "default " + data.defaults.top_p;
    $maxTokens.placeholder = "default " + data.defaults.max_new_tokens;
  }

  function badges(s) {
    const label = s.user_preset_name || (s.system_prompt ? "own prompt" : data.preset_id);
    $presetBadge.textContent = label;
    if (s.model) $modelBadge.textContent = s.model;
  }

  function values() {
    const out = {
      temperature: numberOrNull($temperature),
      top_p: numberOrNull($topP),
      max_new_tokens: numberOrNull($maxTokens),
      model: $model.value || null,
    };
    if (!data.locked) out.system_prompt = $system.value;
    return out;
  }

  // The API's error as one sentence: the field's message where it names one.
  function errorText(body) {
    if (body && body.errors) {
      const field = Object.keys(body.errors)[0];
      const msg = body.errors[field];
      return (Array.isArray(msg) ? msg[0] : String(msg));
    }
    return (body && body.detail) || "The settings could not be saved.";
  }

  async function call(method, url, body) {
    const res = await fetch(url, {
      method: method,
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRFToken": csrfToken() },
      body: JSON.stringify(body),
    });
    let json = null;
    try { json = await res.json(); } catch (e) { json = null; }
    if (!res.ok) throw new Error(errorText(json));
    return json;
  }

  function applied(s, text) {
    show(s);
    badges(s);
    status(text, false);
  }

  $form.addEventListener("submit", async function (e) {
    e.preventDefault();
    status("Saving…", false);
    try {
      applied(await call("PATCH", settingsUrl, values()), "Saved: applies from your next message.");
    } catch (err) {
      status(err.message, true);
    }
  });

  function addPickerOption(preset) {
    const group = document.getElementById("user-preset-options");
    if (!group) return;
    const option = document.createElement("option");
    option.value = "user:" + preset.id;
    option.textContent = preset.name;
    group.append(option);
    group.hidden = false;
  }

  if ($presetSave) {
    $presetSave.addEventListener("click", async function () {
      const name = $presetName.value.trim();
      if (!name) { status("Give the preset a name.", true); $presetName.focus(); return; }
      status("Saving…", false);
      try {
        const preset = await call("POST", "/api/user-presets/", Object.assign({ name: name }, values()));
        addPickerOption(preset);
        // This chat is now on the preset: its settings, and the header names it.
        applied(await call("PATCH", settingsUrl, { user_preset_id: preset.id }),
          "Saved as “" + preset.name + "”: pick it for a new chat.");
        $presetName.value = "";
      } catch (err) {
        status(err.message, true);
      }
    });
  }

  show(data);
})();
