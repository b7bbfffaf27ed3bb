"""Per-language tree-sitter grammars and queries: what is a definition, an import, a comment.

One `LanguageSpec` per grammar. Queries tag nodes with these capture names, which regions.py reads:
  @definition.function  a function or method (signature + body)
  @definition.class     a class-like container whose body holds other definitions
  @definition.variable  a named top-level item kept whole (constant, type, struct)
  @name                 the name a definition binds
  @import               an import statement (kept when a name near the cursor comes from it)
  @comment              a comment
  @docstring            a docstring (Python)
  @string               a string literal (an elision never cuts one that spans lines)
Languages without a spec get no tree; the packer falls back to a line window around the cursor.
"""

from __future__ import annotations

import builtins
import importlib
import threading
from dataclasses import dataclass, field

PYTHON_QUERY = """
(function_definition name: (identifier) @name) @definition.function
(class_definition name: (identifier) @name) @definition.class
(module (expression_statement (assignment left: (identifier) @name)) @definition.variable)
(class_definition body: (block (expression_statement (assignment left: (identifier) @name)) @definition.variable))
(import_statement) @import
(import_from_statement) @import
(future_import_statement) @import
(comment) @comment
(function_definition body: (block . (expression_statement (string) @docstring)))
(class_definition body: (block . (expression_statement (string) @docstring)))
(module . (expression_statement (string) @docstring))
(string) @string
"""

JAVASCRIPT_QUERY = """
(function_declaration name: (identifier) @name) @definition.function
(generator_function_declaration name: (identifier) @name) @definition.function
(class_declaration name: (_) @name) @definition.class
(method_definition name: (_) @name) @definition.function
(program (lexical_declaration (variable_declarator name: (identifier) @name)) @definition.variable)
(program (variable_declaration (variable_declarator name: (identifier) @name)) @definition.variable)
(export_statement (lexical_declaration (variable_declarator name: (identifier) @name)) @definition.variable)
(import_statement) @import
(comment) @comment
(template_string) @string
"""

TYPESCRIPT_QUERY = JAVASCRIPT_QUERY + """
(abstract_class_declaration name: (_) @name) @definition.class
(interface_declaration name: (_) @name) @definition.variable
(type_alias_declaration name: (_) @name) @definition.variable
(enum_declaration name: (_) @name) @definition.variable
(function_signature name: (_) @name) @definition.function
"""

GO_QUERY = """
(function_declaration name: (identifier) @name) @definition.function
(method_declaration name: (field_identifier) @name) @definition.function
(type_declaration (type_spec name: (type_identifier) @name)) @definition.variable
(source_file (const_declaration (const_spec name: (identifier) @name)) @definition.variable)
(source_file (var_declaration (var_spec name: (identifier) @name)) @definition.variable)
(import_declaration) @import
(comment) @comment
(raw_string_literal) @string
"""

RUST_QUERY = """
(function_item name: (identifier) @name) @definition.function
(function_signature_item name: (identifier) @name) @definition.function
(macro_definition name: (identifier) @name) @definition.variable
(struct_item name: (type_identifier) @name) @definition.variable
(enum_item name: (type_identifier) @name) @definition.variable
(union_item name: (type_identifier) @name) @definition.variable
(type_item name: (type_identifier) @name) @definition.variable
(const_item name: (identifier) @name) @definition.variable
(static_item name: (identifier) @name) @definition.variable
(trait_item name: (type_identifier) @name) @definition.class
(impl_item type: (_) @name) @definition.class
(mod_item name: (identifier) @name body: (_)) @definition.class
(use_declaration) @import
(line_comment) @comment
(block_comment) @comment
(raw_string_literal) @string
(string_literal) @string
"""


@dataclass(frozen=True)
class LanguageSpec:
    name: str  # grammar name
    module: str  # the grammar wheel's module
    function: str  # its function returning the language pointer
    query: str
    comment: str  # line-comment prefix, used for elision markers and file headers
    # wrappers whose start counts as the definition's start (decorators, `export`)
    wrappers: tuple[str, ...] = ()
    # node types of function-like definitions: other definitions inside them are not indexed
    function_types: tuple[str, ...] = field(default=())


SPECS: dict[str, LanguageSpec] = {
    "python": LanguageSpec("python", "tree_sitter_python", "language", PYTHON_QUERY, "#",
                           ("decorated_definition",), ("function_definition", "lambda")),
    "javascript": LanguageSpec("javascript", "tree_sitter_javascript", "language", JAVASCRIPT_QUERY, "//",
                               ("export_statement",),
                               ("function_declaration", "generator_function_declaration", "method_definition",
                                "function_expression", "arrow_function")),
    "typescript": LanguageSpec("typescript", "tree_sitter_typescript", "language_typescript", TYPESCRIPT_QUERY,
                               "//", ("export_statement",),
                               ("function_declaration", "generator_function_declaration", "method_definition",
                                "function_expression", "arrow_function")),
    "tsx": LanguageSpec("tsx", "tree_sitter_typescript", "language_tsx", TYPESCRIPT_QUERY, "//",
                        ("export_statement",),
                        ("function_declaration", "generator_function_declaration", "method_definition",
                         "function_expression", "arrow_function")),
    "go": LanguageSpec("go", "tree_sitter_go", "language", GO_QUERY, "//", (),
                       ("function_declaration", "method_declaration", "func_literal")),
    "rust": LanguageSpec("rust", "tree_sitter_rust", "language", RUST_QUERY, "//", (),
                         ("function_item", "closure_expression")),
}

# LSP language id -> grammar
GRAMMAR_FOR_LANGUAGE_ID = {
    "python": "python", "javascript": "javascript", "javascriptreact": "javascript",
    "typescript": "typescript", "typescriptreact": "tsx", "go": "go", "rust": "rust",
}

# File suffix -> LSP language id, for files read from disk (the editor names the language of open ones).
LANGUAGES_BY_SUFFIX = {
    ".py": "python", ".pyi": "python", ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript",
    ".jsx": "javascriptreact", ".ts": "typescript", ".tsx": "typescriptreact", ".go": "go", ".rs": "rust",
    ".c": "c", ".h": "c", ".cpp": "cpp", ".cc": "cpp", ".hpp": "cpp", ".java": "java", ".lua": "lua",
    ".sh": "shellscript", ".rb": "ruby",
}

# Open documents of one family may define the symbols used in another (a .ts file importing a .js one).
FAMILY = {"python": "python", "javascript": "ecmascript", "javascriptreact": "ecmascript",
          "typescript": "ecmascript", "typescriptreact": "ecmascript", "go": "go", "rust": "rust"}

# Names every file of a family has without defining them: a definition of one in another file (a
# compatibility shim's `str = str`) says nothing about the code at the cursor.
BUILTINS = {
    "python": frozenset(dir(builtins)) | {"self", "cls"},
    "ecmascript": frozenset({"Array", "Boolean", "Date", "Error", "JSON", "Map", "Math", "Number", "Object",
                             "Promise", "Reflect", "RegExp", "Set", "String", "Symbol", "WeakMap", "console",
                             "document", "window", "undefined", "require", "module", "exports"}),
    "go": frozenset({"append", "bool", "byte", "cap", "close", "complex", "copy", "delete", "error", "float32",
                     "float64", "int", "int32", "int64", "len", "make", "new", "nil", "panic", "print",
                     "println", "recover", "rune", "string", "uint", "uint8", "uint32", "uint64", "any"}),
    "rust": frozenset({"Box", "Err", "None", "Ok", "Option", "Result", "Self", "Some", "String", "Vec",
                       "self", "println", "format", "vec"}),
}

_lock = threading.Lock()
_languages: dict[str, object] = {}
_queries: dict[str, object] = {}
_local = threading.local()  # parsers are not thread-safe: one per thread and grammar


def spec_for(language_id: str) -> LanguageSpec | None:
    grammar = GRAMMAR_FOR_LANGUAGE_ID.get(language_id)
    return SPECS.get(grammar) if grammar else None


def comment_prefix(language_id: str) -> str:
    spec = spec_for(language_id)
    if spec is not None:
        return spec.comment
    return "#" if language_id in ("shellscript", "ruby", "perl", "r", "toml", "yaml") else "//"


def _language(spec: LanguageSpec):
    with _lock:
        if spec.name not in _languages:
            import tree_sitter

            module = importlib.import_module(spec.module)
            _languages[spec.name] = tree_sitter.Language(getattr(module, spec.function)())
        return _languages[spec.name]


def parser_for(language_id: str):
    """A tree-sitter Parser for `language_id` (created lazily, one per thread), or None."""
    spec = spec_for(language_id)
    if spec is None:
        return None
    parsers = getattr(_local, "parsers", None)
    if parsers is None:
        parsers = _local.parsers = {}
    if spec.name not in parsers:
        import tree_sitter

        parsers[spec.name] = tree_sitter.Parser(_language(spec))
    return parsers[spec.name]


def query_for(language_id: str):
    """The compiled tags query of `language_id` (see the capture names above), or None."""
    spec = spec_for(language_id)
    if spec is None:
        return None
    language = _language(spec)
    with _lock:
        if spec.name not in _queries:
            import tree_sitter

            _queries[spec.name] = tree_sitter.Query(language, spec.query)
        return _queries[spec.name]


def matches(language_id: str, node) -> list[dict[str, list]]:
    """One dict (capture name -> nodes) per match of the tags query over `node`, so that a
    definition stays paired with its @name."""
    import tree_sitter

    query = query_for(language_id)
    return [m for _, m in tree_sitter.QueryCursor(query).matches(node)] if query is not None else []
