/*
 * template.c - qwenc_chat_render(): a checkpoint's Jinja chat template applied to an OpenAI-style
 * request, giving the text transformers' tokenizer.apply_chat_template(..., tokenize=False) gives.
 *
 * The template variables are built as transformers builds them (tokenization_utils_base
 * apply_chat_template + chat_template_utils.render_jinja_template): the tokenizer's special tokens
 * (bos_token, eos_token), then the caller's extra variables (the request's "chat_template_kwargs"), then
 * enable_thinking when the caller sets it; messages, tools (None when the request has none), documents
 * (None) and add_generation_prompt are passed by the renderer itself. The interpreter lives in
 * src/text/tmpl_*.c (see tmpl.h).
 */
#include <string.h>

#include "text/tmpl.h"

/* Everything that may fail, run under the setjmp of qwenc_chat_render. */
static void render(tp_ctx *c, const char *template_src, const char *request_json, int add_generation_prompt,
                   int enable_thinking, const char *bos_token, const char *eos_token, tp_buf *out) {
    tp_nodes prog = tp_parse(c, template_src, strlen(template_src));
    tv_value req = tv_json_parse(c, request_json, strlen(request_json), "request JSON");
    if (req.type != TV_DICT) tp_fail(c, QWENC_ERR_ARG, 0, "request JSON: expected an object, found %s", tv_type_name(req));
    tv_value *messages = tv_dict_get_str(req.u.d, "messages");
    if (!messages || messages->type != TV_LIST)
        tp_fail(c, QWENC_ERR_ARG, 0, "request JSON: expected a \"messages\" array, found %s",
                messages ? tv_type_name(*messages) : "none");
    if (messages->u.l->n == 0) /* as apply_chat_template, before the template sees it */
        tp_fail(c, QWENC_ERR_ARG, 0, "request JSON: \"messages\" is empty: a chat template needs at least one message");
    tv_value *tools = tv_dict_get_str(req.u.d, "tools");
    tv_value *kwargs = tv_dict_get_str(req.u.d, "chat_template_kwargs");

    tp_scope *root = tp_scope_new(c, NULL);
    if (bos_token) tp_scope_set(c, root, "bos_token", tv_strz(bos_token));
    if (eos_token) tp_scope_set(c, root, "eos_token", tv_strz(eos_token));
    if (kwargs && kwargs->type != TV_NONE) {
        static const char *const reserved[] = {"messages", "tools", "documents", "add_generation_prompt"};
        if (kwargs->type != TV_DICT)
            tp_fail(c, QWENC_ERR_ARG, 0, "request JSON: \"chat_template_kwargs\" must be an object, found %s",
                    tv_type_name(*kwargs));
        for (size_t i = 0; i < kwargs->u.d->n; i++) {
            tv_value k = kwargs->u.d->keys[i];
            char name[128];
            snprintf(name, sizeof(name), "%.*s", (int)k.u.s.n, k.u.s.p);
            for (size_t r = 0; r < sizeof(reserved) / sizeof(reserved[0]); r++)
                if (!strcmp(name, reserved[r]))
                    tp_fail(c, QWENC_ERR_ARG, 0, "request JSON: \"chat_template_kwargs\" may not set '%s'", name);
            tv_dict_set(c, &root->vars, k, kwargs->u.d->vals[i]);
        }
    }
    if (enable_thinking >= 0) tp_scope_set(c, root, "enable_thinking", tv_bool(enable_thinking));
    tp_scope_set(c, root, "messages", *messages);
    tp_scope_set(c, root, "tools", tools ? *tools : tv_none());
    tp_scope_set(c, root, "documents", tv_none());
    tp_scope_set(c, root, "add_generation_prompt", tv_bool(add_generation_prompt));
    c->scope = root;
    tp_buf_add(c, out, "", 0);
    tp_exec(c, &prog, out);
}

qwenc_status qwenc_chat_render(const char *template_src, const char *request_json, int add_generation_prompt,
                               int enable_thinking, const char *bos_token, const char *eos_token, char **out,
                               char *err, size_t errlen) {
    if (!out) return qw_err(err, errlen, QWENC_ERR_ARG, "qwenc_chat_render: out is NULL");
    *out = NULL;
    if (!template_src) return qw_err(err, errlen, QWENC_ERR_ARG, "qwenc_chat_render: no chat template given");
    if (!request_json) return qw_err(err, errlen, QWENC_ERR_ARG, "qwenc_chat_render: no request JSON given");
    tp_ctx *c = calloc(1, sizeof(tp_ctx));
    if (!c) return qw_err(err, errlen, QWENC_ERR_NOMEM, "chat template: out of memory");
    tp_buf *buf = calloc(1, sizeof(tp_buf));
    qwenc_status st = QWENC_OK;
    if (!buf) {
        st = qw_err(err, errlen, QWENC_ERR_NOMEM, "chat template: out of memory");
    } else if (setjmp(c->jmp) == 0) {
        render(c, template_src, request_json, add_generation_prompt, enable_thinking, bos_token, eos_token, buf);
        *out = memchr(buf->p, 0, buf->n) ? NULL : malloc(buf->n + 1);
        if (memchr(buf->p, 0, buf->n)) {
            st = qw_err(err, errlen, QWENC_ERR_UNSUPPORTED,
                        "the rendered chat template contains a NUL character at byte %zu (from a \\u0000 in the "
                        "request JSON or an escape in the template)",
                        (size_t)((char *)memchr(buf->p, 0, buf->n) - buf->p));
        } else if (*out) {
            memcpy(*out, buf->p, buf->n + 1);
        } else {
            st = qw_err(err, errlen, QWENC_ERR_NOMEM, "chat template: out of memory for %zu bytes of output", buf->n);
        }
    } else {
        st = c->status;
        if (c->line > 0) qw_err(err, errlen, st, "chat template line %d: %s", c->line, c->msg);
        else qw_err(err, errlen, st, "%s", c->msg);
    }
    tp_arena_free(c);
    free(buf);
    free(c);
    return st;
}
