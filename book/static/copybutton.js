// A "copy" button on every code block of cpcourse's website (added by book/cpcourse_site.py).
// The clipboard API can be missing or refused (a page opened from file://, a browser without
// the permission): then the code is copied through a selected, hidden text area instead.
(function () {
  function copyBySelection(text) {
    var area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.style.position = "fixed";
    area.style.opacity = "0";
    document.body.appendChild(area);
    area.select();
    var ok = false;
    try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
    document.body.removeChild(area);
    return ok;
  }
  function copyText(text) {
    if (!navigator.clipboard || !window.isSecureContext) {
      return Promise.resolve(copyBySelection(text));
    }
    var refused = new Promise(function (resolve) { setTimeout(resolve, 1000, "late"); });
    return Promise.race([navigator.clipboard.writeText(text).then(function () { return true; }),
                         refused])
      .then(function (done) { return done === true || copyBySelection(text); },
            function () { return copyBySelection(text); });
  }
  function addButtons() {
    document.querySelectorAll("div.highlight").forEach(function (block) {
      var pre = block.querySelector("pre");
      if (!pre || block.querySelector("button.cpc-copy")) return;
      var button = document.createElement("button");
      button.className = "cpc-copy";
      button.type = "button";
      button.textContent = "copy";
      button.title = "Copy this code";
      button.addEventListener("click", function () {
        copyText(pre.innerText.replace(/\n$/, "")).then(function (ok) {
          button.textContent = ok ? "copied" : "select it and press Ctrl+C";
          setTimeout(function () { button.textContent = "copy"; }, 2000);
        });
      });
      block.appendChild(button);
    });
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", addButtons);
  } else {
    addButtons();
  }
})();
