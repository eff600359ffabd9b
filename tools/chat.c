/*
 * chat.c - `qwenc run` (one prompt, streamed answer) and `qwenc chat` (interactive multi-turn chat).
 *
 * A chat keeps one session for the whole conversation and feeds each new turn only. The text of a new
 * turn is found by rendering the chat template with two markers: one in place of the last assistant
 * reply and one in place of the new user message; what the template puts after the first marker (the
 * end of the previous turn, the new user turn, the generation prompt) is fed, with the real message put
 * back for the second marker. This holds however the template re-renders older turns (Qwen3 templates
 * drop the reasoning of earlier replies, which would break a plain prefix comparison).
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <editline/readline.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

#define MARK_REPLY "@@qwenc-previous-reply@@"
#define MARK_USER "@@qwenc-new-user-message@@"

typedef struct {
    qwenc_model *model;
    qwenc_tokenizer *tok;
    qwenc_session *session;
    qwenc_sampler *sampler;
    const int32_t *eos;
    int n_eos;
    double load_s;
} engine;

static void engine_free(engine *e) {
    qwenc_sampler_free(e->sampler);
    qwenc_session_free(e->session);
    qwenc_tokenizer_free(e->tok);
    qwenc_model_free(e->model);
}

static int engine_init(engine *e, cli_opts *o) {
    memset(e, 0, sizeof(*e));
    double t0 = cli_now_s();
    char err[1024];
    if (!(e->model = cli_load_model(o)) || !(e->tok = cli_load_tokenizer(o))) return 0;
    qwenc_session_params sp = qwenc_session_default_params();
    if (o->ctx) sp.n_ctx = o->ctx;
    if (qwenc_session_init(e->model, &sp, &e->session, err, sizeof(err))) {
        fprintf(stderr, "qwenc: %s\n", err);
        return 0;
    }
    if (!o->seed_set) o->sp.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    if (qwenc_sampler_init(&o->sp, qwenc_model_n_vocab(e->model), &e->sampler, err, sizeof(err))) {
        fprintf(stderr, "qwenc: %s\n", err);
        return 0;
    }
    e->n_eos = qwenc_tokenizer_eos(e->tok, &e->eos);
    e->load_s = cli_now_s() - t0;
    return 1;
}

/* The template's text for a request body; NULL (message printed) on failure. */
static char *render(engine *e, cJSON *messages, int add_gen, int no_think) {
    const char *tmpl = qwenc_tokenizer_chat_template(e->tok);
    if (!tmpl) {
        fprintf(stderr, "qwenc: the model has no chat template (tokenizer_config.json \"chat_template\" or "
                        "chat_template.jinja)\n");
        return NULL;
    }
    cJSON *req = cJSON_CreateObject();
    cJSON_AddItemReferenceToObject(req, "messages", messages);
    char *body = cJSON_PrintUnformatted(req), err[1024], *out = NULL;
    cJSON_Delete(req);
    if (qwenc_chat_render(tmpl, body, add_gen, no_think ? 0 : -1, cli_bos_token(e->tok),
                          qwenc_tokenizer_eos_str(e->tok), &out, err, sizeof(err))) {
        fprintf(stderr, "qwenc: chat template: %s\n", err);
        out = NULL;
    }
    free(body);
    return out;
}

static void add_message(cJSON *messages, const char *role, const char *content) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddStringToObject(m, "content", content);
    cJSON_AddItemToArray(messages, m);
}

static int32_t *tokenize(engine *e, const char *text, int add_bos, int *n) {
    int32_t *ids = NULL;
    char err[1024];
    if (qwenc_tokenize(e->tok, text, strlen(text), add_bos, 1, &ids, n, err, sizeof(err))) {
        fprintf(stderr, "qwenc: %s\n", err);
        return NULL;
    }
    return ids;
}

/* Collects the reply while printing it. */
typedef struct {
    char *buf;
    size_t len, cap;
} text_buf;

static int on_text(const char *text, size_t len, void *user) {
    text_buf *b = user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    if (b) {
        if (b->len + len + 1 > b->cap) {
            b->cap = (b->len + len + 1) * 2;
            char *nb = realloc(b->buf, b->cap);
            if (!nb) return 1;
            b->buf = nb;
        }
        memcpy(b->buf + b->len, text, len);
        b->len += len;
        b->buf[b->len] = 0;
    }
    return 0;
}

static void print_stats(const engine *e, const qwenc_gen_result *r, const cli_opts *o) {
    fprintf(stderr, "\nqwenc: load %.2f s | prompt %d tokens %.3f s (%.1f tok/s) | generated %d tokens %.3f s "
                    "(%.1f tok/s) | stop: %s | seed %llu\n",
            e->load_s, r->n_prompt, r->prompt_s, r->prompt_s > 0 ? r->n_prompt / r->prompt_s : 0.0, r->n_gen,
            r->gen_s, r->gen_s > 0 ? r->n_gen / r->gen_s : 0.0, qwenc_stop_reason_str(r->reason),
            (unsigned long long)o->sp.seed);
}

static qwenc_gen_params gen_params(const engine *e, const cli_opts *o, int default_n) {
    qwenc_gen_params gp = {.n_predict = o->n_predict == -2147483647 - 1 ? default_n : o->n_predict,
                           .eos = e->eos, .n_eos = e->n_eos, .stop = o->stop, .n_stop = o->n_stop,
                           .skip_special = !o->show_special};
    return gp;
}

int cmd_run(cli_opts *o) {
    char *prompt = NULL;
    if (o->file) {
        if (!(prompt = cli_slurp(o->file, NULL))) return 1;
    } else if (o->prompt) {
        prompt = strdup(o->prompt);
    } else {
        fprintf(stderr, "qwenc: run: give a prompt with -p TEXT or -f FILE\n");
        return 1;
    }
    engine e;
    int rc = 1, n = 0;
    int32_t *ids = NULL;
    char *text = NULL, err[1024];
    if (!engine_init(&e, o)) goto done;
    if (o->chat) {
        cJSON *msgs = cJSON_CreateArray();
        if (o->system) add_message(msgs, "system", o->system);
        add_message(msgs, "user", prompt);
        text = render(&e, msgs, 1, o->no_think);
        cJSON_Delete(msgs);
        if (!text) goto done;
        ids = tokenize(&e, text, 0, &n);
    } else {
        ids = tokenize(&e, prompt, 1, &n);
    }
    if (!ids) goto done;
    if (n == 0) {
        fprintf(stderr, "qwenc: run: the prompt has no tokens\n");
        goto done;
    }
    qwenc_gen_params gp = gen_params(&e, o, 256);
    qwenc_gen_result r;
    if (qwenc_generate(e.session, e.tok, e.sampler, ids, n, &gp, on_text, NULL, &r, err, sizeof(err))) {
        fprintf(stderr, "\nqwenc: %s\n", err);
        goto done;
    }
    print_stats(&e, &r, o);
    rc = 0;
done:
    free(ids);
    free(text);
    free(prompt);
    engine_free(&e);
    return rc;
}

/* Read one line; NULL at end of input. Line editing and history on a terminal. */
static char *read_line(int tty) {
    if (tty) {
        char *l = readline("> ");
        if (l && *l) add_history(l);
        return l;
    }
    char *l = NULL;
    size_t cap = 0;
    ssize_t n = getline(&l, &cap, stdin);
    if (n < 0) {
        free(l);
        return NULL;
    }
    while (n > 0 && (l[n - 1] == '\n' || l[n - 1] == '\r')) l[--n] = 0;
    return l;
}

/* The text to feed for a new user turn after at least one reply (see the file comment); NULL if the
 * template does not place the markers as expected. */
static char *turn_text(engine *e, cJSON *messages, const char *user_msg, int no_think) {
    cJSON *m = cJSON_Duplicate(messages, 1);
    cJSON *last = cJSON_GetArrayItem(m, cJSON_GetArraySize(m) - 1);
    cJSON_ReplaceItemInObject(last, "content", cJSON_CreateString(MARK_REPLY));
    add_message(m, "user", MARK_USER);
    char *r = render(e, m, 1, no_think);
    cJSON_Delete(m);
    if (!r) return NULL;
    char *a = strstr(r, MARK_REPLY), *u = a ? strstr(a, MARK_USER) : NULL;
    char *out = NULL;
    if (u && !strstr(u + strlen(MARK_USER), MARK_USER)) {
        a += strlen(MARK_REPLY);
        size_t la = (size_t)(u - a), lu = strlen(user_msg), lt = strlen(u + strlen(MARK_USER));
        out = malloc(la + lu + lt + 1);
        memcpy(out, a, la);
        memcpy(out + la, user_msg, lu);
        memcpy(out + la + lu, u + strlen(MARK_USER), lt + 1);
    }
    free(r);
    return out;
}

int cmd_chat(cli_opts *o) {
    engine e;
    if (!engine_init(&e, o)) {
        engine_free(&e);
        return 1;
    }
    if (!qwenc_tokenizer_chat_template(e.tok)) {
        fprintf(stderr, "qwenc: chat: %s has no chat template\n", o->model);
        engine_free(&e);
        return 1;
    }
    int tty = isatty(0);
    if (tty)
        fprintf(stderr, "qwenc chat: %s. Type a message; /reset starts over, /exit (or Ctrl-D) quits.\n",
                qwenc_model_arch(e.model));
    cJSON *messages = cJSON_CreateArray();
    if (o->system) add_message(messages, "system", o->system);
    int32_t unfed = -1;
    qwenc_gen_params gp = gen_params(&e, o, -1);
    int rc = 0;
    for (char *line; (line = read_line(tty)); free(line)) {
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) {
            free(line);
            break;
        }
        if (!strcmp(line, "/reset")) {
            qwenc_session_reset(e.session);
            qwenc_sampler_reset(e.sampler);
            cJSON_Delete(messages);
            messages = cJSON_CreateArray();
            if (o->system) add_message(messages, "system", o->system);
            unfed = -1;
            fprintf(stderr, "(conversation reset)\n");
            continue;
        }
        if (!*line) continue;
        char *text = NULL;
        int n = 0, feed_unfed = 0;
        if (qwenc_session_n_past(e.session) > 0) text = turn_text(&e, messages, line, o->no_think);
        if (text && unfed >= 0) {
            /* the sampled end-of-turn token opens the text to feed: feed the id itself */
            const char *t = qwenc_tokenizer_token_text(e.tok, unfed);
            int is_eos = 0;
            for (int i = 0; i < e.n_eos; i++) is_eos |= e.eos[i] == unfed;
            if (is_eos && t && *t && !strncmp(text, t, strlen(t))) memmove(text, text + strlen(t), strlen(text + strlen(t)) + 1);
            feed_unfed = 1;
        }
        if (!text) { /* first turn, or a template the markers cannot follow: feed everything */
            if (qwenc_session_n_past(e.session) > 0)
                fprintf(stderr, "(the chat template re-renders the history: processing it again)\n");
            qwenc_session_reset(e.session);
            add_message(messages, "user", line);
            text = render(&e, messages, 1, o->no_think);
            cJSON_DeleteItemFromArray(messages, cJSON_GetArraySize(messages) - 1);
            feed_unfed = 0;
        }
        int32_t *ids = text ? tokenize(&e, text, 0, &n) : NULL;
        free(text);
        if (!ids) {
            rc = 1;
            free(line);
            break;
        }
        if (feed_unfed) { /* prepend the unfed token */
            int32_t *all = malloc((size_t)(n + 1) * sizeof(int32_t));
            all[0] = unfed;
            memcpy(all + 1, ids, (size_t)n * sizeof(int32_t));
            free(ids);
            ids = all;
            n++;
        }
        add_message(messages, "user", line);
        text_buf reply = {0};
        qwenc_gen_result r;
        char err[1024];
        qwenc_status st = n ? qwenc_generate(e.session, e.tok, e.sampler, ids, n, &gp, on_text, &reply, &r, err, sizeof(err))
                            : QWENC_ERR_ARG;
        free(ids);
        printf("\n");
        if (st) {
            fprintf(stderr, "qwenc: %s\n", n ? err : "the turn has no tokens");
            free(reply.buf);
            if (st == QWENC_ERR_CONTEXT) {
                fprintf(stderr, "(type /reset to start a new conversation)\n");
                cJSON_DeleteItemFromArray(messages, cJSON_GetArraySize(messages) - 1);
                continue;
            }
            rc = 1;
            free(line);
            break;
        }
        add_message(messages, "assistant", reply.buf ? reply.buf : "");
        free(reply.buf);
        unfed = r.unfed;
        if (r.reason == QWENC_STOP_CONTEXT) fprintf(stderr, "(context full: type /reset to start over)\n");
        fprintf(stderr, "[fed %d tokens, generated %d tokens at %.1f tok/s, %d in context; stop: %s]\n", r.n_prompt,
                r.n_gen, r.gen_s > 0 ? r.n_gen / r.gen_s : 0.0, qwenc_session_n_past(e.session),
                qwenc_stop_reason_str(r.reason));
    }
    cJSON_Delete(messages);
    engine_free(&e);
    return rc;
}
