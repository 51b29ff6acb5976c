// SpeakerMem console: a little progressive enhancement, nothing the pages need to work.
// A form that is being submitted shows it and cannot be sent twice (asking can take seconds).
document.addEventListener("submit", function (event) {
  var form = event.target;
  if (form.dataset.sent) {
    event.preventDefault();
    return;
  }
  form.dataset.sent = "1";
  var button = form.querySelector("button[type=submit]");
  if (button) {
    button.setAttribute("aria-busy", "true");
    button.classList.add("busy");
  }
});
// Back/forward caches keep the sent mark: clear it when the page is shown again.
window.addEventListener("pageshow", function () {
  document.querySelectorAll("form[data-sent]").forEach(function (form) {
    delete form.dataset.sent;
    var button = form.querySelector("button.busy");
    if (button) {
      button.classList.remove("busy");
      button.removeAttribute("aria-busy");
    }
  });
});
