import assert from "node:assert/strict";
import { test } from "node:test";

import { visitedParams } from "../visits";

const LANGUAGES = ["python", "go"];

test("leaving a file of a completed language tells the server the line", () => {
  assert.deepEqual(visitedParams("file:///p/a.py", "file", "python", 41, LANGUAGES),
    { textDocument: { uri: "file:///p/a.py" }, line: 41 });
});

test("entering a file says so: the server prefills the prompt at that line", () => {
  assert.deepEqual(visitedParams("file:///p/a.py", "file", "python", 7, LANGUAGES, true),
    { textDocument: { uri: "file:///p/a.py" }, line: 7, entered: true });
});

test("nothing is sent for no editor, another language, or a document that is no file", () => {
  assert.equal(visitedParams(undefined, undefined, undefined, undefined, LANGUAGES), undefined);
  assert.equal(visitedParams("file:///p/notes.md", "file", "markdown", 3, LANGUAGES), undefined);
  assert.equal(visitedParams("untitled:Untitled-1", "untitled", "python", 0, LANGUAGES), undefined);
  assert.equal(visitedParams("output:MemoSight", "output", "log", 0, LANGUAGES), undefined);
});
