/* tests/test_header.c - megatron.h's own shape: the table of contents is the law.
 *
 * Reads megatron.h (and docs/map.md) as text and checks what a reader relies on:
 *  - the sections: the TOC in the doc block, the interface's banners ("/" "* N. TITLE") and the
 *    implementation's banners ("// N. TITLE") list the same 12 titles in the same order, and
 *    every interface banner is followed by a "defines:" line;
 *  - every function defined in the implementation is static or declared in the interface,
 *    under the section of the same number;
 *  - the GPU build's #ifdef __CUDACC__ blocks: each is marked "(k of N)", their count is N, and N
 *    is at most 8 (the backend seam keeps the build difference in few places);
 *  - docs/map.md: every section it names exists with that title, every mt_ function it names is
 *    defined in megatron.h or kernels.cuh, and every "megatron.h:LINE" anchor points within
 *    MAP_SLACK lines of the line that defines the function named next to it (a screenful: small
 *    edits above do not break it, moves do). `tests/test_header --fix-map` makes them exact.
 */
#include "harness.h"
#include <ctype.h>
#include <regex.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LINES 20000
#define MAP_SLACK 40   // lines an anchor in docs/map.md may be off before the test fails
#define MAX_FUNCS 2000

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = (char *)malloc((size_t)n + 1);
    size_t got = fread(s, 1, (size_t)n, f);
    s[got] = 0;
    fclose(f);
    return s;
}

// the file as lines (pointers into a copy whose newlines became NULs); returns the count
static int split_lines(char *text, char **lines) {
    int n = 0;
    char *p = text;
    while (*p && n < MAX_LINES) {
        lines[n++] = p;
        char *e = strchr(p, '\n');
        if (!e) break;
        *e = 0;
        p = e + 1;
    }
    return n;
}

static char *H_text, *H_whole, *H_lines[MAX_LINES];   // H_whole: the text, not split
static int H_n, H_impl;   // line count, index of the "#ifdef MEGATRON_IMPLEMENTATION" line

static int load_header(void) {
    if (H_text) return 1;
    H_text = read_text("megatron.h");
    H_whole = read_text("megatron.h");
    if (!H_text || !H_whole) return 0;
    H_n = split_lines(H_text, H_lines);
    H_impl = -1;
    for (int i = 0; i < H_n; i++)
        if (strcmp(H_lines[i], "#ifdef MEGATRON_IMPLEMENTATION") == 0) { H_impl = i; break; }
    return H_impl > 0;
}

// "N. TITLE" banners: in the implementation "// N. TITLE", in the interface "/* N. TITLE"
static int section_number(const char *line, const char *prefix, char *title, size_t cap) {
    size_t pl = strlen(prefix);
    if (strncmp(line, prefix, pl) != 0 || !isdigit((unsigned char)line[pl])) return 0;
    char *end;
    long n = strtol(line + pl, &end, 10);
    if (end[0] != '.' || end[1] != ' ') return 0;
    snprintf(title, cap, "%s", end + 2);
    size_t len = strlen(title);
    while (len > 0 && (title[len - 1] == ' ' || title[len - 1] == '/' || title[len - 1] == '*')) title[--len] = 0;
    return (int)n;
}

static char impl_titles[13][128], iface_titles[13][128], toc_titles[13][128];
static int impl_section_of_line[MAX_LINES], iface_section_of_line[MAX_LINES];

static void scan_sections(void) {
    int sec = 0;
    char title[128];
    for (int i = 0; i < H_n; i++) {
        if (i < H_impl) {
            int n = section_number(H_lines[i], "/* ", title, sizeof title);
            if (n >= 1 && n <= 12) { sec = n; snprintf(iface_titles[n], sizeof iface_titles[n], "%s", title); }
            iface_section_of_line[i] = sec;
            if (i == H_impl - 1) sec = 0;
        } else {
            int n = section_number(H_lines[i], "// ", title, sizeof title);
            if (n >= 1 && n <= 12) { sec = n; snprintf(impl_titles[n], sizeof impl_titles[n], "%s", title); }
            impl_section_of_line[i] = sec;
        }
    }
    // the TOC: lines "   N. TITLE   what it holds" between "TABLE OF CONTENTS" and the next blank line
    int in_toc = 0;
    for (int i = 0; i < H_impl; i++) {
        if (strstr(H_lines[i], "TABLE OF CONTENTS")) { in_toc = 1; continue; }
        if (!in_toc) continue;
        if (H_lines[i][0] == 0) break;
        const char *p = H_lines[i];
        while (*p == ' ') p++;
        char *end;
        long n = strtol(p, &end, 10);
        if (end == p || end[0] != '.' || end[1] != ' ' || n < 1 || n > 12) continue;
        const char *t = end + 2;
        const char *gap = strstr(t, "  ");
        size_t len = gap ? (size_t)(gap - t) : strlen(t);
        snprintf(toc_titles[n], sizeof toc_titles[n], "%.*s", (int)len, t);
    }
}

MT_TEST(sections_match_the_table_of_contents) {
    mt_expect(load_header(), "cannot read megatron.h (run from the repository root)");
    scan_sections();
    for (int n = 1; n <= 12; n++) {
        mt_expect(impl_titles[n][0] != 0, "the implementation has no banner '// %d. ...'", n);
        mt_expect(strcmp(impl_titles[n], iface_titles[n]) == 0, "section %d: implementation '%s', interface '%s'", n,
                  impl_titles[n], iface_titles[n]);
        mt_expect(strcmp(impl_titles[n], toc_titles[n]) == 0, "section %d: implementation '%s', table of contents '%s'",
                  n, impl_titles[n], toc_titles[n]);
    }
    // banners in increasing order, and each interface banner followed by its "defines:" line
    int last = 0;
    char title[128];
    for (int i = H_impl; i < H_n; i++) {
        int n = section_number(H_lines[i], "// ", title, sizeof title);
        if (n <= 0) continue;
        mt_expect(n == last + 1, "implementation line %d: section %d follows section %d", i + 1, n, last);
        last = n;
    }
    for (int i = 0; i < H_impl; i++) {
        int n = section_number(H_lines[i], "/* ", title, sizeof title);
        if (n <= 0) continue;
        mt_expect(i + 1 < H_impl && strstr(H_lines[i + 1], "defines:") != NULL,
                  "interface section %d (line %d) does not open with a 'defines:' line", n, i + 1);
    }
}

// the function a line at column 0 defines or declares: its name, and whether the text after
// the parameter list opens a body ('{') rather than ending a declaration (';')
static int function_at(int i, char *name, size_t cap, int *is_definition) {
    const char *l = H_lines[i];
    if (!isalpha((unsigned char)l[0])) return 0;
    if (!strncmp(l, "static", 6) || !strncmp(l, "typedef", 7) || !strncmp(l, "return", 6)) return 0;
    if (!strncmp(l, "struct", 6) && strchr(l, '(') == NULL) return 0;
    // the first "mt_name(" that starts a word (the return type may be an mt_ type)
    const char *p = l, *q = NULL;
    for (p = strstr(p, "mt_"); p; p = strstr(p + 1, "mt_")) {
        if (p > l && (isalnum((unsigned char)p[-1]) || p[-1] == '_')) continue;
        q = p;
        while (isalnum((unsigned char)*q) || *q == '_') q++;
        if (*q == '(') break;
    }
    if (!p) return 0;
    // everything before the name must look like a type: words, '*', spaces
    for (const char *t = l; t < p; t++)
        if (!(isalnum((unsigned char)*t) || *t == '_' || *t == ' ' || *t == '*')) return 0;
    snprintf(name, cap, "%.*s", (int)(q - p), p);
    int depth = 0;
    for (int k = i; k < H_n && k < i + 12; k++) {
        for (const char *c = k == i ? q : H_lines[k]; *c; c++) {
            if (*c == '(') depth++;
            else if (*c == ')') depth--;
            else if (depth == 0 && *c == '{') { *is_definition = 1; return 1; }
            else if (depth == 0 && *c == ';') { *is_definition = 0; return 1; }
        }
    }
    return 0;
}

static char decl_names[MAX_FUNCS][96];
static int decl_section[MAX_FUNCS], n_decls;

static void scan_declarations(void) {
    n_decls = 0;
    for (int i = 0; i < H_impl && n_decls < MAX_FUNCS; i++) {
        char name[96];
        int def = 0;
        if (!function_at(i, name, sizeof name, &def) || def) continue;
        snprintf(decl_names[n_decls], sizeof decl_names[0], "%s", name);
        decl_section[n_decls++] = iface_section_of_line[i];
    }
}

MT_TEST(every_public_function_is_declared_in_its_section) {
    mt_expect(load_header(), "cannot read megatron.h");
    scan_sections();
    scan_declarations();
    int definitions = 0, undeclared = 0;
    for (int i = H_impl; i < H_n; i++) {
        char name[96];
        int def = 0;
        if (!function_at(i, name, sizeof name, &def) || !def) continue;
        definitions++;
        int found = -1;
        for (int d = 0; d < n_decls; d++)
            if (strcmp(decl_names[d], name) == 0) { found = d; break; }
        if (found < 0) {
            undeclared++;
            mt_expect(0, "megatron.h:%d: %s is neither static nor declared in the interface", i + 1, name);
            continue;
        }
        mt_expect(decl_section[found] == impl_section_of_line[i],
                  "megatron.h:%d: %s is defined in section %d but declared under section %d", i + 1, name,
                  impl_section_of_line[i], decl_section[found]);
    }
    printf("  %d public functions defined, %d undeclared, %d declarations\n", definitions, undeclared, n_decls);
    mt_expect(definitions > 100, "the scan found only %d definitions: the parser is broken", definitions);
}

MT_TEST(cuda_ifdefs_are_few_and_marked) {
    mt_expect(load_header(), "cannot read megatron.h");
    int count = 0, documented = -1, seen[16] = {0};
    for (int i = 0; i < H_n; i++) {
        const char *l = H_lines[i];
        if (strncmp(l, "#if", 3) != 0 && strncmp(l, "#elif", 5) != 0) continue;
        if (!strstr(l, "__CUDACC__")) continue;
        count++;
        const char *m = strstr(l, " of ");
        int k = 0, n = 0;
        if (m) {
            const char *open = m;
            while (open > l && open[-1] != '(') open--;
            k = atoi(open);
            n = atoi(m + 4);
        }
        mt_expect(m && k >= 1 && n >= 1, "megatron.h:%d: '%s' is not marked '(k of N)' with the reason beside it", i + 1, l);
        if (documented < 0) documented = n;
        mt_expect(n == documented, "megatron.h:%d: says 'of %d', an earlier one 'of %d'", i + 1, n, documented);
        if (k >= 1 && k < 16) seen[k]++;
    }
    printf("  #if ... __CUDACC__ in megatron.h: %d (documented: %d)\n", count, documented);
    mt_expect(count == documented, "%d #if __CUDACC__ lines, but they say 'of %d'", count, documented);
    mt_expect(count <= 8, "%d #if __CUDACC__ lines: the backend seam should keep them to at most 8", count);
    for (int k = 1; k <= count && k < 16; k++) mt_expect(seen[k] == 1, "'(%d of %d)' appears %d times", k, count, seen[k]);
}

// --------------------------------------------------------------------------------------------
// docs/map.md
// the line of megatron.h that defines function `name` (1-based), 0 if none
static int definition_line(const char *name) {
    for (int i = H_impl; i < H_n; i++) {
        char got[96];
        int def = 0;
        if (function_at(i, got, sizeof got, &def) && def && strcmp(got, name) == 0) return i + 1;
        const char *l = H_lines[i];
        if (!strncmp(l, "static ", 7)) {   // static functions are named in the map too
            const char *p = strstr(l, name);
            size_t n = strlen(name);
            if (p && p[n] == '(' && (p == l || !(isalnum((unsigned char)p[-1]) || p[-1] == '_')) && !strchr(l, ';'))
                return i + 1;
        }
    }
    return 0;
}

static int defined_in_kernels(const char *kernels, const char *name) {
    char pat[128];
    snprintf(pat, sizeof pat, " %s(", name);
    return kernels && strstr(kernels, pat) != NULL;
}

static int check_map(int fix) {
    if (!load_header()) return 0;
    scan_sections();
    char *map = read_text("docs/map.md");
    mt_expect(map != NULL, "cannot read docs/map.md");
    if (!map) return 0;
    char *kernels = read_text("kernels.cuh");
    size_t cap = strlen(map) * 2 + 1024, o = 0;
    char *out = (char *)malloc(cap);
    int names = 0, anchors = 0, sections = 0, stale = 0, inexact = 0;
    for (const char *p = map; *p;) {
        // "§N TITLE" must name section N by its title
        if (!strncmp(p, "\xc2\xa7", 2) && isdigit((unsigned char)p[2])) {
            int n = atoi(p + 2);
            const char *t = p + 2;
            while (isdigit((unsigned char)*t)) t++;
            if (*t == ' ' && n >= 1 && n <= 12 && isupper((unsigned char)t[1])) {
                sections++;
                size_t len = strlen(impl_titles[n]);
                mt_expect(strncmp(t + 1, impl_titles[n], len) == 0, "docs/map.md: section %d is '%s' in megatron.h", n,
                          impl_titles[n]);
            }
        }
        // "megatron.h:LINE `name`": the line must define name
        if (!strncmp(p, "megatron.h:", 11) && isdigit((unsigned char)p[11])) {
            const char *num = p + 11, *e = num;
            while (isdigit((unsigned char)*e)) e++;
            if (e[0] == ' ' && e[1] == '`') {
                const char *nm = e + 2, *ne = strchr(nm, '`');
                char name[96];
                snprintf(name, sizeof name, "%.*s", ne ? (int)(ne - nm) : 0, nm);
                char *paren = strchr(name, '(');
                if (paren) *paren = 0;
                int want = definition_line(name), got = atoi(num);
                anchors++;
                if (want && want != got) inexact++;
                // an anchor may lag the code by a screenful (edits above it move it a little);
                // further off, or at a function that is gone, it fails; --fix-map makes it exact
                if (want == 0 || abs(want - got) > MAP_SLACK) {
                    stale++;
                    if (!fix)
                        mt_expect(0, "docs/map.md: megatron.h:%d should be megatron.h:%d for %s (tests/test_header --fix-map)",
                                  got, want, name);
                }
                o += (size_t)snprintf(out + o, cap - o, "megatron.h:%d", fix && want ? want : got);
                p = e;
                continue;
            }
        }
        // every `mt_...` name must exist
        if (p[0] == '`' && !strncmp(p + 1, "mt_", 3)) {
            const char *nm = p + 1, *ne = nm;
            while (isalnum((unsigned char)*ne) || *ne == '_') ne++;
            char name[96];
            snprintf(name, sizeof name, "%.*s", (int)(ne - nm), nm);
            if ((*ne == '(' || *ne == '`') && ne - nm > 3) {
                names++;
                int exists = definition_line(name) > 0 || defined_in_kernels(kernels, name) || strstr(H_whole, name);
                mt_expect(exists, "docs/map.md names %s, which megatron.h and kernels.cuh do not have", name);
            }
        }
        out[o++] = *p++;
    }
    out[o] = 0;
    printf("  docs/map.md: %d sections, %d names, %d line anchors (%d stale)\n", sections, names, anchors, stale);
    mt_expect(sections >= 12 && anchors >= 10, "docs/map.md should name all 12 sections and anchor the step's path");
    if (fix && inexact) {
        FILE *f = fopen("docs/map.md", "wb");
        if (f) { fputs(out, f); fclose(f); printf("  rewrote %d anchors in docs/map.md\n", inexact); }
    }
    free(out); free(map); free(kernels);
    return 1;
}

MT_TEST(docs_map_is_true) { check_map(0); }

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--fix-map") == 0) { check_map(1); return 0; }
    mt_run_test(sections_match_the_table_of_contents);
    mt_run_test(every_public_function_is_declared_in_its_section);
    mt_run_test(cuda_ifdefs_are_few_and_marked);
    mt_run_test(docs_map_is_true);
    return mt_test_summary();
}
