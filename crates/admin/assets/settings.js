// Tocsin settings pages: small enhancements over pages that work without this script.
// - the webhook form checks its fields as the server will, and shows the retry schedule
//   that "max attempts" implies;
// - the signing secret gets a copy button;
// - deleting asks for confirmation in a dialog;
// - Retry on a delivery's page enqueues the attempt with fetch and shows it when it is made,
//   without reloading the page.
"use strict";

(function () {
  // ---- Webhook form -------------------------------------------------------------------

  const MAX_NAME_CHARS = 100;

  function checkName(value) {
    const name = value.trim();
    if (name === "") return "must not be empty";
    if ([...name].length > MAX_NAME_CHARS) return "must be at most 100 characters";
    if (/[\u0000-\u001f\u007f-\u009f]/.test(name)) return "must not contain control characters";
    return null;
  }

  function checkUrl(value) {
    const text = value.trim();
    let url;
    try {
      url = new URL(text);
    } catch (_) {
      return "must be an absolute URL such as https://hooks.example.com/tocsin";
    }
    if (url.protocol !== "http:" && url.protocol !== "https:") return "scheme must be http or https";
    if (!url.hostname) return "must have a host";
    if (url.username || url.password) return "must not carry a user name or password";
    if (text.length > 2048) return "must be at most 2048 bytes";
    return null;
  }

  function checkRange(value, min, max, message) {
    const text = value.trim();
    if (text === "") return null; // the server applies the default
    if (!/^-?\d+$/.test(text)) return message;
    const n = Number(text);
    return n < min || n > max ? message : null;
  }

  function showError(form, field, message) {
    const error = form.querySelector("#" + field + "-error");
    const container = error && error.closest(".field");
    const inputs = field === "events"
      ? form.querySelectorAll('input[name="events"]')
      : form.querySelectorAll("#" + field);
    if (error) {
      error.textContent = message || "";
      error.hidden = !message;
    }
    if (container) container.classList.toggle("field--invalid", Boolean(message));
    inputs.forEach(function (input) {
      if (message) input.setAttribute("aria-invalid", "true");
      else input.removeAttribute("aria-invalid");
    });
  }

  function validateWebhookForm(form) {
    const maxAttempts = form.querySelector("#max_attempts");
    const limit = maxAttempts ? Number(maxAttempts.max) || 5 : 5;
    const checks = [
      ["name", checkName(form.querySelector("#name").value)],
      ["url", checkUrl(form.querySelector("#url").value)],
      [
        "events",
        form.querySelectorAll('input[name="events"]:checked').length === 0
          ? "must list at least one event kind"
          : null,
      ],
      [
        "max_attempts",
        checkRange(maxAttempts.value, 1, limit, "max_attempts must be between 1 and " + limit),
      ],
      [
        "timeout_ms",
        checkRange(
          form.querySelector("#timeout_ms").value,
          1000,
          30000,
          "timeout_ms must be between 1000 and 30000"
        ),
      ],
    ];
    let first = null;
    checks.forEach(function ([field, message]) {
      showError(form, field, message);
      if (message && !first) first = field === "events" ? "event-0" : field;
    });
    return first;
  }

  function updateSchedule(input) {
    const output = document.getElementById("schedule");
    if (!output) return;
    const steps = (input.dataset.scheduleSteps || "").split("|").filter(Boolean);
    const n = Number(input.value);
    if (!Number.isInteger(n) || n < 1 || n > steps.length) {
      output.textContent = "1 to " + steps.length + " attempts";
      return;
    }
    output.textContent = steps.slice(0, n).join(", ");
  }

  document.querySelectorAll("form[data-webhook-form]").forEach(function (form) {
    form.addEventListener("submit", function (event) {
      const first = validateWebhookForm(form);
      if (first) {
        event.preventDefault();
        const summary = document.querySelector("[data-error-summary]");
        if (summary) summary.hidden = true;
        const target = document.getElementById(first);
        if (target) target.focus();
      }
    });
    // Once a field was refused, re-check it as it changes.
    form.addEventListener("input", function (event) {
      const input = event.target;
      const field = input.name === "events" ? "events" : input.id;
      if (input.id === "max_attempts") updateSchedule(input);
      const error = form.querySelector("#" + field + "-error");
      if (error && !error.hidden) validateWebhookForm(form);
    });
    const maxAttempts = form.querySelector("#max_attempts");
    if (maxAttempts) updateSchedule(maxAttempts);
  });

  const summary = document.querySelector("[data-error-summary]");
  if (summary) summary.focus();

  // ---- Copy the secret ----------------------------------------------------------------

  document.querySelectorAll("button[data-copy]").forEach(function (button) {
    const input = document.getElementById(button.dataset.copy);
    const status = document.getElementById("copy-status");
    if (!input) return;
    button.hidden = false;
    button.addEventListener("click", async function () {
      let copied = false;
      try {
        await navigator.clipboard.writeText(input.value);
        copied = true;
      } catch (_) {
        input.select();
        copied = document.execCommand && document.execCommand("copy");
      }
      if (status) {
        status.textContent = copied
          ? "Copied to the clipboard."
          : "Could not copy: select the secret and copy it by hand.";
      }
    });
  });

  // ---- Confirm before deleting ----------------------------------------------------------

  document.querySelectorAll("form[data-confirm]").forEach(function (form) {
    form.addEventListener("submit", function (event) {
      if (!window.confirm(form.dataset.confirm)) {
        event.preventDefault();
        return;
      }
      const confirmed = form.querySelector("[data-confirmed]");
      if (confirmed) confirmed.value = "yes";
    });
  });

  // ---- Retry without a reload -----------------------------------------------------------

  const POLL_EVERY_MS = 400;
  const GIVE_UP_AFTER_MS = 30000;

  function attemptCount(root) {
    return root.querySelectorAll("#attempts [data-attempt]").length;
  }

  function describe(attempt) {
    const number = attempt.dataset.attempt;
    const trigger = attempt.dataset.trigger;
    const code = attempt.querySelector("[data-status-code]");
    const status = code ? code.textContent.trim() : "";
    if (attempt.dataset.result === "succeeded") {
      return "Attempt " + number + " (" + trigger + ") succeeded with HTTP " + status + ".";
    }
    return /^\d+$/.test(status)
      ? "Attempt " + number + " (" + trigger + ") failed with HTTP " + status + "."
      : "Attempt " + number + " (" + trigger + ") failed: no answer.";
  }

  async function waitForAttempt(before, status) {
    const deadline = Date.now() + GIVE_UP_AFTER_MS;
    while (Date.now() < deadline) {
      await new Promise(function (resolve) {
        setTimeout(resolve, POLL_EVERY_MS);
      });
      const response = await fetch(window.location.pathname, {
        headers: { Accept: "text/html" },
        cache: "no-store",
        credentials: "same-origin",
      });
      if (!response.ok) continue;
      const page = new DOMParser().parseFromString(await response.text(), "text/html");
      if (attemptCount(page) <= before) continue;
      // Logged before its request goes out: wait for its answer.
      const newest = page.querySelectorAll("#attempts [data-attempt]");
      if (newest[newest.length - 1].dataset.result === "under-way") {
        status.textContent = "Attempt " + newest[newest.length - 1].dataset.attempt + " is under way…";
        continue;
      }
      ["attempts", "delivery-summary"].forEach(function (id) {
        const fresh = page.getElementById(id);
        const current = document.getElementById(id);
        if (fresh && current) current.replaceWith(document.importNode(fresh, true));
      });
      const attempts = document.querySelectorAll("#attempts [data-attempt]");
      for (let i = before; i < attempts.length; i++) attempts[i].classList.add("attempt--new");
      status.textContent = describe(attempts[attempts.length - 1]);
      return;
    }
    status.textContent = "The attempt has not been made yet; reload the page later to see it.";
  }

  document.querySelectorAll("form[data-retry]").forEach(function (form) {
    form.addEventListener("submit", async function (event) {
      event.preventDefault();
      const button = form.querySelector("button[type=submit]");
      const status = document.getElementById("retry-status");
      const before = attemptCount(document);
      button.disabled = true;
      status.textContent = "Requesting a manual attempt…";
      try {
        const response = await fetch(form.action, {
          method: "POST",
          headers: { Accept: "application/json" },
          body: new URLSearchParams(new FormData(form)),
          credentials: "same-origin",
        });
        if (response.redirected) {
          window.location.assign(response.url);
          return;
        }
        if (response.status !== 202) {
          let message = "the server answered " + response.status;
          try {
            message = (await response.json()).error.message;
          } catch (_) {
            // not JSON: keep the status
          }
          status.textContent = "Retry refused: " + message;
          return;
        }
        status.textContent = "Manual attempt enqueued; waiting for it to be made…";
        await waitForAttempt(before, status);
      } catch (_) {
        status.textContent = "Could not reach the server; try again.";
      } finally {
        button.disabled = false;
      }
    });
  });
})();
