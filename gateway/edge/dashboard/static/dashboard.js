// svc-gateway dashboard: the one script. Copies a token shown once to the clipboard.
// Everything else works without it (plain forms, server-rendered pages).
"use strict";
document.addEventListener("click", async (event) => {
  const button = event.target.closest("[data-copy]");
  if (!button) return;
  const field = document.getElementById(button.dataset.copy);
  const status = document.querySelector("[data-copy-status]");
  field.focus();
  field.select();
  let copied = false;
  try {
    await navigator.clipboard.writeText(field.value);
    copied = true;
  } catch (_) {
    copied = document.execCommand && document.execCommand("copy");
  }
  button.textContent = copied ? "Copied" : "Copy";
  if (status) {
    status.textContent = copied
      ? "Copied to the clipboard."
      : "Select the token and copy it with Ctrl+C (or ⌘C).";
  }
});
