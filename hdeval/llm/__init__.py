"""The one LLM client: settings, the event loop, backends, the reply cache, request files and
the run-time estimate. It knows no method, prompt or score."""
