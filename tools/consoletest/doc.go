// Package consoletest holds the operator console's browser test: the console driven in a
// headless Chromium (chromedp), a dependency kept out of the library's module.
package consoletest
