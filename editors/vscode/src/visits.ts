// Where the user was in a file they leave: the server keeps that code as recently seen, context for
// completions in their other files (as llama.vim gathers chunks when a buffer is left). Where they are
// in a file they enter (`entered`): the server prefills the prompt there while they read. No 'vscode'
// import, so that it is tested with node alone.

export const VISITED_METHOD = "memosight/visited";

export interface VisitedParams {
  textDocument: { uri: string };
  line: number;
  entered?: true;
}

/** The notification for leaving (or, `entered`, entering) an editor on `line` of `uri`, or undefined
 * where there is nothing to say: no editor, a language the server does not complete, or a document
 * that is no file. */
export function visitedParams(uri: string | undefined, scheme: string | undefined, languageId: string | undefined,
  line: number | undefined, languages: readonly string[], entered = false): VisitedParams | undefined {
  if (!uri || scheme !== "file" || !languageId || !languages.includes(languageId) || line === undefined || line < 0) {
    return undefined;
  }
  return entered ? { textDocument: { uri }, line, entered: true } : { textDocument: { uri }, line };
}
