/*
 * chat.c - `qwenc run` (one prompt, echoed, then the streamed answer) and `qwenc chat` (interactive multi-turn
 * chat).
 *
 * A chat keeps one session for the whole conversation and feeds each new turn only. The text of a new
 * turn is found by rendering the chat template with two markers: one in place of the last assistant
 * reply and one in place of the new user message; what the template puts after the first marker (the
 * end of the previous turn, the new user turn, the generation prompt) is fed, with the real message put
 * back for the second marker. This holds however the template re-renders older turns (Qwen3 templates
 * drop the reasoning of earlier replies, which would break a plain prefix comparison).
 *
 * A bad turn never ends the conversation: a message is read as the tokenizer reads text (invalid UTF-8 as
 * U+FFFD), one the template refuses to render is not sent, and one that does not fit in the context is
 * refused with /reset offered. With --context-shift the conversation slides instead: DeltaNet and
 * convolution states cannot drop their oldest tokens, so sliding re-renders the system message and the
 * latest turns that fit (leaving -n tokens, or a quarter of the context, for the reply), resets the session
 * and feeds them again. Ctrl-C stops a reply and keeps what was said; at the prompt it quits, as Ctrl-D does.
 * SIGTERM stops the reply and quits.
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <editline/readline.h>
#include <errno.h>
#include <signal.h>
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
    if (o->batch) sp.n_batch = o->batch;
    sp.draft_head = o->draft != 0 && o->draft_src != QWENC_DRAFT_SRC_LOOKUP;
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

/* The template's text for a list of messages; NULL (message printed) on failure. */
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
    if (!body || qwenc_chat_render(tmpl, body, add_gen, no_think ? 0 : -1, cli_bos_token(e->tok),
                                   qwenc_tokenizer_eos_str(e->tok), &out, err, sizeof(err))) {
        fprintf(stderr, "qwenc: chat template: %s\n", body ? err : "out of memory");
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

static int32_t *tokenize(engine *e, const char *text, size_t len, int add_bos, int *n) {
    int32_t *ids = NULL;
    char err[1024];
    if (qwenc_tokenize(e->tok, text, len, add_bos, 1, &ids, n, err, sizeof(err))) {
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

/* Prints the text as it comes; stops the generation once SIGINT or SIGTERM has arrived. */
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
    return cli_stop_signal != 0;
}

/* --draft: how the drafts fared (stderr). */
static void print_draft_stats(const qwenc_gen_result *r) {
    fprintf(stderr, "qwenc: draft: %d model steps for %d tokens (%.2f per step) | drafted %d, accepted %d (%.1f %%)",
            r->n_steps, r->n_gen, r->n_steps ? (double)r->n_gen / r->n_steps : 0.0, r->n_drafted, r->n_accepted,
            r->n_drafted ? 100.0 * r->n_accepted / r->n_drafted : 0.0);
    const char *sep = " | by position:";
    for (int i = 0; i < QWENC_MAX_DRAFT && r->drafted_at[i]; i++, sep = "")
        fprintf(stderr, "%s %d/%d", sep, r->accepted_at[i], r->drafted_at[i]);
    fprintf(stderr, "\n");
}

static void print_stats(const engine *e, const qwenc_gen_result *r, const cli_opts *o) {
    fprintf(stderr, "\nqwenc: load %.2f s | prompt %d tokens %.3f s (%.1f tok/s) | generated %d tokens %.3f s "
                    "(%.1f tok/s) | stop: %s | seed %llu\n",
            e->load_s, r->n_prompt, r->prompt_s, r->prompt_s > 0 ? r->n_prompt / r->prompt_s : 0.0, r->n_gen,
            r->gen_s, r->gen_s > 0 ? r->n_gen / r->gen_s : 0.0,
            r->reason == QWENC_STOP_CALLER && cli_stop_signal ? "interrupted" : qwenc_stop_reason_str(r->reason),
            (unsigned long long)o->sp.seed);
    if (o->draft) print_draft_stats(r);
}

static qwenc_gen_params gen_params(const engine *e, const cli_opts *o, int default_n) {
    qwenc_gen_params gp = {.n_predict = o->n_predict == CLI_UNSET ? default_n : o->n_predict,
                           .eos = e->eos, .n_eos = e->n_eos, .stop = o->stop, .n_stop = o->n_stop,
                           .skip_special = !o->show_special, .n_draft = o->draft,
                           .draft_src = o->draft_src, .draft_sample = o->draft_sample};
    return gp;
}

/* Print the prompt as the model reads it (its tokens decoded; special tokens only with --show-special). */
static void echo_prompt(engine *e, const int32_t *ids, int n, int show_special) {
    char *text = NULL, err[256];
    size_t len = 0;
    if (!qwenc_detokenize(e->tok, ids, n, !show_special, &text, &len, err, sizeof(err))) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
    }
    free(text);
}

int cmd_run(cli_opts *o) {
    char *prompt = NULL;
    size_t len = 0;
    const char *src = o->file ? o->file : "-p";
    if (o->file) {
        if (!(prompt = cli_slurp(o->file, &len))) return 1;
    } else if (o->prompt) {
        prompt = strdup(o->prompt);
        len = strlen(prompt);
    } else {
        fprintf(stderr, "qwenc: run: give a prompt with -p TEXT or -f FILE\n");
        return 1;
    }
    const char *nul = memchr(prompt, 0, len);
    if (o->chat && nul) { /* a plain prompt keeps it: the tokenizer reads U+0000 as any character */
        fprintf(stderr, "qwenc: %s: a NUL byte at offset %td; a chat message cannot hold one (chat templates take "
                        "text): remove it, or run without --chat\n", src, nul - prompt);
        free(prompt);
        return 1;
    }
    engine e;
    int rc = 1, n = 0;
    int32_t *ids = NULL;
    char *text = NULL, err[1024];
    if (!engine_init(&e, o)) goto done;
    if (o->chat) {
        char *user = qwenc_utf8_repair(prompt, len);
        char *sys = o->system ? qwenc_utf8_repair(o->system, strlen(o->system)) : NULL;
        cJSON *msgs = cJSON_CreateArray();
        if (sys) add_message(msgs, "system", sys);
        add_message(msgs, "user", user ? user : "");
        text = render(&e, msgs, 1, o->no_think);
        cJSON_Delete(msgs);
        free(user);
        free(sys);
        if (!text) goto done;
        ids = tokenize(&e, text, strlen(text), 0, &n);
    } else {
        ids = tokenize(&e, prompt, len, 1, &n);
    }
    if (!ids) goto done;
    if (n == 0) {
        fprintf(stderr, "qwenc: run: the prompt has no tokens\n");
        goto done;
    }
    qwenc_gen_params gp = gen_params(&e, o, 256);
    int n_ctx = qwenc_session_n_ctx(e.session), train = qwenc_model_n_ctx_train(e.model);
    /* the last generated token is not fed: n tokens of prompt leave room for n_ctx - n + 1 */
    if (n > n_ctx || (gp.n_predict > 0 && (int64_t)n + gp.n_predict - 1 > n_ctx)) {
        if (gp.n_predict > 0)
            fprintf(stderr, "qwenc: run: a prompt of %d tokens and -n %d exceed the context of %d tokens: raise -c "
                            "(the model was trained on %d), lower -n or shorten the prompt\n", n, gp.n_predict,
                    n_ctx, train);
        else
            fprintf(stderr, "qwenc: run: a prompt of %d tokens exceeds the context of %d tokens: raise -c (the model "
                            "was trained on %d) or shorten the prompt\n", n, n_ctx, train);
        goto done;
    }
    if (!o->no_display_prompt) echo_prompt(&e, ids, n, o->show_special);
    qwenc_gen_result r;
    cli_signals(CLI_SIG_STOP);
    qwenc_status st = qwenc_generate(e.session, e.tok, e.sampler, ids, n, &gp, on_text, NULL, &r, err, sizeof(err));
    cli_signals(CLI_SIG_DEFAULT);
    if (st) {
        fprintf(stderr, "\nqwenc: %s\n", err);
        goto done;
    }
    print_stats(&e, &r, o);
    rc = cli_stop_signal ? 128 + cli_stop_signal : 0;
done:
    free(ids);
    free(text);
    free(prompt);
    engine_free(&e);
    return rc;
}

/* ------------------------------------------------------------------ chat */

/* Read one line (*len bytes, which may include NUL bytes); NULL at the end of input or on a signal. Line
 * editing and history on a terminal. */
static char *read_line(int tty, size_t *len) {
    if (tty) {
        char *l = readline("> ");
        if (l && *l) add_history(l);
        if (l) *len = strlen(l);
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
    *len = (size_t)n;
    return l;
}

typedef struct {
    engine *e;
    const cli_opts *o;
    cJSON *messages; /* the conversation as the template sees it */
    const char *system;  /* valid UTF-8, or NULL */
    int32_t unfed;   /* the sampled end of the last reply, not yet fed (-1: none) */
} chat_state;

static void chat_restart(chat_state *c) {
    cJSON_Delete(c->messages);
    c->messages = cJSON_CreateArray();
    if (c->system) add_message(c->messages, "system", c->system);
    c->unfed = -1;
}

/* The text to feed for a new user turn after at least one reply (see the file comment); NULL if the
 * template does not place the markers as expected. */
static char *turn_text(chat_state *c, const char *user_msg) {
    cJSON *m = cJSON_Duplicate(c->messages, 1);
    cJSON *last = cJSON_GetArrayItem(m, cJSON_GetArraySize(m) - 1);
    cJSON_ReplaceItemInObject(last, "content", cJSON_CreateString(MARK_REPLY));
    add_message(m, "user", MARK_USER);
    char *r = render(c->e, m, 1, c->o->no_think);
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

/* The whole conversation of `messages` followed by the user message, tokenized; NULL (message printed) if the
 * template refuses it. */
static int32_t *whole_tokens(chat_state *c, cJSON *messages, const char *msg, int *n) {
    add_message(messages, "user", msg);
    char *text = render(c->e, messages, 1, c->o->no_think);
    cJSON_DeleteItemFromArray(messages, cJSON_GetArraySize(messages) - 1);
    int32_t *ids = text ? tokenize(c->e, text, strlen(text), 0, n) : NULL;
    free(text);
    return ids;
}

/*
 * The tokens to feed for a new user message: the new turn only when the session holds the conversation
 * (*restart = 0), else the whole conversation (*restart = 1: the session must start over). NULL (message
 * printed) when the template cannot render the conversation with this message.
 */
static int32_t *turn_tokens(chat_state *c, const char *msg, int *n, int *restart) {
    engine *e = c->e;
    /* the whole conversation first: a message the template refuses is refused here */
    int32_t *whole = whole_tokens(c, c->messages, msg, n);
    *restart = 1;
    if (!whole || qwenc_session_n_past(e->session) == 0) return whole;
    char *text = turn_text(c, msg);
    if (!text) {
        fprintf(stderr, "(the chat template re-renders the history: processing it again)\n");
        return whole;
    }
    int feed_unfed = 0;
    if (c->unfed >= 0) {
        /* the sampled end-of-turn token opens the text to feed: feed the id itself */
        const char *t = qwenc_tokenizer_token_text(e->tok, c->unfed);
        int is_eos = 0;
        for (int i = 0; i < e->n_eos; i++) is_eos |= e->eos[i] == c->unfed;
        size_t lt = t ? strlen(t) : 0;
        if (is_eos && lt && !strncmp(text, t, lt)) memmove(text, text + lt, strlen(text + lt) + 1);
        feed_unfed = 1;
    }
    int k = 0;
    int32_t *ids = tokenize(e, text, strlen(text), 0, &k);
    free(text);
    if (!ids) return whole;
    free(whole);
    *restart = 0;
    *n = k;
    if (feed_unfed) { /* prepend the unfed token */
        int32_t *all = malloc((size_t)(k + 1) * sizeof(int32_t));
        all[0] = c->unfed;
        memcpy(all + 1, ids, (size_t)k * sizeof(int32_t));
        free(ids);
        ids = all;
        (*n)++;
    }
    return ids;
}

/*
 * --context-shift: drop the oldest turns (a user message and its reply) until the system message, the turns
 * kept and the new message leave `reserve` tokens for the reply (or, with no turn left, fit at all). On
 * success c->messages holds what is kept and the tokens of the whole conversation are returned.
 */
static int32_t *slide(chat_state *c, const char *msg, int reserve, int *n) {
    int n_ctx = qwenc_session_n_ctx(c->e->session), first = c->system ? 1 : 0;
    cJSON *m = cJSON_Duplicate(c->messages, 1);
    for (int dropped = 0;; dropped++) {
        int32_t *ids = whole_tokens(c, m, msg, n);
        if (!ids) break;
        int turns_left = (cJSON_GetArraySize(m) - first) / 2;
        if (*n + reserve <= n_ctx || (turns_left == 0 && *n < n_ctx)) {
            fprintf(stderr, "(context full: dropped the %d oldest turn%s; the system message and %d turn%s are fed "
                            "again)\n", dropped, dropped == 1 ? "" : "s", turns_left, turns_left == 1 ? "" : "s");
            cJSON_Delete(c->messages);
            c->messages = m;
            c->unfed = -1;
            return ids;
        }
        free(ids);
        if (turns_left == 0) {
            fprintf(stderr, "qwenc: this message takes %d tokens with the system message; the context holds %d: "
                            "shorten it, or start chat with a larger -c\n", *n, n_ctx);
            break;
        }
        cJSON_DeleteItemFromArray(m, first);
        cJSON_DeleteItemFromArray(m, first);
    }
    cJSON_Delete(m);
    return NULL;
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
        fprintf(stderr, "qwenc chat: %s. Type a message; /reset starts over, /exit or Ctrl-D quits, Ctrl-C stops a "
                        "reply.\n", qwenc_model_arch(e.model));
    char *system = o->system ? qwenc_utf8_repair(o->system, strlen(o->system)) : NULL;
    chat_state c = {.e = &e, .o = o, .system = system, .unfed = -1};
    chat_restart(&c);
    qwenc_gen_params gp = gen_params(&e, o, -1);
    int n_ctx = qwenc_session_n_ctx(e.session);
    int reserve = gp.n_predict >= 0 ? gp.n_predict : n_ctx / 4; /* room --context-shift leaves for a reply */
    cli_signals(CLI_SIG_KEEP);
    size_t len = 0;
    /* a signal after the last reply was accounted for is a Ctrl-C at the prompt */
    for (char *line; !cli_stop_signal && (line = read_line(tty, &len)); free(line)) {
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) {
            free(line);
            break;
        }
        if (!strcmp(line, "/reset")) {
            qwenc_session_reset(e.session);
            qwenc_sampler_reset(e.sampler);
            chat_restart(&c);
            fprintf(stderr, "(conversation reset)\n");
            continue;
        }
        if (len == 0) continue;
        const char *nul = memchr(line, 0, len);
        if (nul) {
            fprintf(stderr, "qwenc: the message holds a NUL byte at offset %td (chat templates take text)\n"
                            "(the message was not sent; the conversation goes on)\n", nul - line);
            continue;
        }
        char *msg = qwenc_utf8_repair(line, len);
        int n = 0, restart = 0;
        int32_t *ids = msg ? turn_tokens(&c, msg, &n, &restart) : NULL;
        if (ids) {
            int past = restart ? 0 : qwenc_session_n_past(e.session);
            if (past + n >= n_ctx || (o->context_shift && past + n + reserve > n_ctx)) {
                free(ids);
                ids = NULL;
                if (o->context_shift) {
                    ids = slide(&c, msg, reserve, &n);
                    restart = 1;
                } else {
                    fprintf(stderr, "qwenc: context full: %d of %d tokens are in use and this turn needs %d more: type "
                                    "/reset to start over (or start chat with --context-shift, to drop the oldest "
                                    "turns, or a larger -c)\n", past, n_ctx, n);
                }
            }
        }
        if (!ids) {
            fprintf(stderr, "(the message was not sent; the conversation goes on)\n");
            free(msg);
            continue;
        }
        if (restart) qwenc_session_reset(e.session);
        add_message(c.messages, "user", msg);
        free(msg);
        text_buf reply = {0};
        qwenc_gen_result r;
        char err[1024];
        qwenc_status st =
            qwenc_generate(e.session, e.tok, e.sampler, ids, n, &gp, on_text, &reply, &r, err, sizeof(err));
        free(ids);
        printf("\n");
        fflush(stdout);
        if (st) { /* the session is as before the failed step: the turn is taken back */
            fprintf(stderr, "qwenc: %s\n(the message was not sent; the conversation goes on)\n", err);
            free(reply.buf);
            cJSON_DeleteItemFromArray(c.messages, cJSON_GetArraySize(c.messages) - 1);
            if (restart) c.unfed = -1; /* the session is empty: the next turn feeds the whole conversation */
            continue;
        }
        add_message(c.messages, "assistant", reply.buf ? reply.buf : "");
        free(reply.buf);
        c.unfed = r.unfed;
        int interrupted = cli_stop_signal;
        if (cli_stop_signal != SIGTERM) cli_stop_signal = 0; /* SIGTERM ends the chat once the reply stops */
        if (r.reason == QWENC_STOP_CONTEXT)
            fprintf(stderr, "(context full at %d tokens: the reply was cut; %s)\n", n_ctx,
                    o->context_shift ? "the next turn drops the oldest turns"
                                     : "type /reset to start over, or start chat with --context-shift to drop the "
                                       "oldest turns");
        fprintf(stderr, "[fed %d tokens, generated %d tokens at %.1f tok/s, %d in context; stop: %s]\n", r.n_prompt,
                r.n_gen, r.gen_s > 0 ? r.n_gen / r.gen_s : 0.0, qwenc_session_n_past(e.session),
                interrupted == SIGTERM ? "terminated (SIGTERM)"
                : interrupted          ? "interrupted (Ctrl-C)"
                                       : qwenc_stop_reason_str(r.reason));
    }
    int sig = cli_stop_signal;
    if (sig == SIGINT) fprintf(stderr, "\n(interrupted at the prompt: bye)\n");
    cli_signals(CLI_SIG_DEFAULT);
    cJSON_Delete(c.messages);
    free(system);
    engine_free(&e);
    return sig == SIGTERM ? 128 + SIGTERM : 0;
}
