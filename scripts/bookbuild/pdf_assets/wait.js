// make pdf: wait for the load event, MathJax's typesetting and the fonts; say what is not right.
const done = arguments[arguments.length - 1];
const started = Date.now();
function finished() {
  const images = Array.from(document.images).filter(i => !i.complete || !i.naturalWidth)
    .map(i => i.getAttribute('src'));
  const raw = Array.from(document.querySelectorAll('.math'))
    .filter(e => !e.querySelector('mjx-container') && e.tagName !== 'MJX-CONTAINER').length;
  done({images: images, raw_math: raw,
        formulas: document.querySelectorAll('mjx-container').length});
}
function wait() {
  if (document.readyState === 'complete' && window.MathJax && MathJax.startup
      && MathJax.startup.promise) {
    MathJax.startup.promise.then(() => document.fonts.ready).then(finished,
      e => done({error: 'MathJax: ' + e}));
  } else if (Date.now() - started > arguments_timeout) {
    done({error: window.MathJax ? 'MathJax never started' : 'MathJax did not load'});
  } else {
    setTimeout(wait, 50);
  }
}
const arguments_timeout = arguments[0];
wait();
