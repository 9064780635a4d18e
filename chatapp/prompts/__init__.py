"""The stable-template prompt manager: token-level history, block-aligned system prompts.

Modules, one job each:
  errors     the PromptError family every caller can catch
  templating Jinja2 sandbox, template front-matter, static safety checks
  presets    versioned system-prompt presets (templates/prompts/presets/)
  formats    chat formats: how roles are wrapped (templates/prompts/formats/)
  encoding   text -> token ids without letting user text forge special tokens
  services   PromptBuilder / PromptPlan: the prompts the engine receives; the text rules
  history    which whole turns a prompt longer than the context leaves out; the marker
  summaries  the summary of those turns: its setting, room, request and segment
  catalog    the presets a conversation can start with, as the chat shows them
  lint       the stability linter (`manage.py prompts lint`)
  profile    recent prompts side by side (`manage.py prompts profile`)
"""
