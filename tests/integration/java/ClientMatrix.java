// The Java JNDI entry of the real-client matrix (test_jndi.py): what
// com.sun.jndi.ldap sends for binds, searches, compares, modifications, adds,
// deletes, renames, paged and sorted searches, one scenario per run.
//
// Usage: ClientMatrix URL BIND_DN PASSWORD SCENARIO [ARGS...]
// (BIND_DN "" binds anonymously). Scenarios:
//   bind                        only connect and bind
//   rootdse                     read the root DSE
//   search BASE FILTER ATTRS    subtree search; ATTRS comma-separated, "*" for all
//   sizelimit BASE FILTER N     subtree search with a count limit of N
//   compare DN FILTER           base-scope search asking for no attributes
//                               (JNDI sends it as an LDAP compare)
//   modify DN                   add, replace and remove values, then errors
//   adddelete PARENT            createSubcontext / destroySubcontext and errors
//   rename OLD NEW MOVED        rename in place, then to another parent
//   list BASE FILTER ATTR PAGE SORT
//                               one-level search returning ATTR; PAGE > 0 pages
//                               with that size (cookie loop), SORT is "-" (no
//                               sort control) or keys like "sn,-uid" ("-" first
//                               means reverse order)
//
// Output, one tab-separated line each:
//   bound <dn>                    the bind succeeded
//   entry <dn> [<value>...]       a search result (list: the ATTR values)
//   attr <label> <name> <value>   an attribute value read back
//   page <n> <entries> <resultSize>
//   sort <result code>            from the sort response control
//   compare <true|false>
//   ok <step>                     an operation succeeded
//   error <step> <exception class> <LDAP code or -1> <resolved name> <remaining name> <message>
//   done                          the scenario ran to its end
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.Hashtable;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import javax.naming.Context;
import javax.naming.NamingEnumeration;
import javax.naming.NamingException;
import javax.naming.directory.Attribute;
import javax.naming.directory.Attributes;
import javax.naming.directory.BasicAttribute;
import javax.naming.directory.BasicAttributes;
import javax.naming.directory.DirContext;
import javax.naming.directory.ModificationItem;
import javax.naming.directory.SearchControls;
import javax.naming.directory.SearchResult;
import javax.naming.ldap.Control;
import javax.naming.ldap.InitialLdapContext;
import javax.naming.ldap.LdapContext;
import javax.naming.ldap.PagedResultsControl;
import javax.naming.ldap.PagedResultsResponseControl;
import javax.naming.ldap.SortControl;
import javax.naming.ldap.SortKey;
import javax.naming.ldap.SortResponseControl;

public class ClientMatrix {
    static final Pattern CODE = Pattern.compile("error code (\\d+)");

    interface Step {
        void run() throws Exception;
    }

    public static void main(String[] args) throws Exception {
        String url = args[0], bindDn = args[1], password = args[2], scenario = args[3];
        String[] rest = Arrays.copyOfRange(args, 4, args.length);
        Hashtable<String, String> env = new Hashtable<>();
        env.put(Context.INITIAL_CONTEXT_FACTORY, "com.sun.jndi.ldap.LdapCtxFactory");
        env.put(Context.PROVIDER_URL, url);
        if (bindDn.isEmpty()) {
            env.put(Context.SECURITY_AUTHENTICATION, "none");
        } else {
            env.put(Context.SECURITY_AUTHENTICATION, "simple");
            env.put(Context.SECURITY_PRINCIPAL, bindDn);
            env.put(Context.SECURITY_CREDENTIALS, password);
        }
        // Every wait bounded: connecting and each read.
        env.put("com.sun.jndi.ldap.connect.timeout", "10000");
        env.put("com.sun.jndi.ldap.read.timeout", "30000");
        LdapContext ctx;
        try {
            ctx = new InitialLdapContext(env, null);
        } catch (NamingException e) {
            error("connect", e);
            say("done");
            return;
        }
        say("bound", bindDn);
        try {
            switch (scenario) {
                case "bind": break;
                case "rootdse": rootDse(ctx); break;
                case "search": search(ctx, rest[0], rest[1], rest[2], 0); break;
                case "sizelimit": search(ctx, rest[0], rest[1], "uid", Integer.parseInt(rest[2])); break;
                case "compare": compare(ctx, rest[0], rest[1]); break;
                case "modify": modify(ctx, rest[0]); break;
                case "adddelete": addDelete(ctx, rest[0]); break;
                case "rename": rename(ctx, rest[0], rest[1], rest[2]); break;
                case "list": list(ctx, rest[0], rest[1], rest[2], Integer.parseInt(rest[3]), rest[4]); break;
                default: throw new IllegalArgumentException("unknown scenario " + scenario);
            }
        } catch (NamingException e) {
            error(scenario, e);
        } finally {
            ctx.close();
        }
        say("done");
    }

    // ------------------------------------------------------------ output

    static void say(String... fields) {
        StringBuilder b = new StringBuilder();
        for (String f : fields) {
            if (b.length() > 0) b.append('\t');
            // One line per record whatever the server sends.
            b.append(f == null ? "" : f.replace('\t', ' ').replace('\n', ' ').replace('\r', ' '));
        }
        System.out.println(b);
        System.out.flush();
    }

    static void error(String step, NamingException e) {
        Matcher m = CODE.matcher(String.valueOf(e.getMessage()));
        String code = m.find() ? m.group(1) : "-1";
        say("error", step, e.getClass().getSimpleName(), code,
            e.getResolvedName() == null ? "" : e.getResolvedName().toString(),
            e.getRemainingName() == null ? "" : e.getRemainingName().toString(), String.valueOf(e.getMessage()));
    }

    /** Runs one operation: "ok <step>" or its error line; never throws a NamingException. */
    static void step(String name, Step s) throws Exception {
        try {
            s.run();
            say("ok", name);
        } catch (NamingException e) {
            error(name, e);
        }
    }

    static String text(Object v) {
        if (v instanceof byte[]) {
            return "base64:" + Base64.getEncoder().encodeToString((byte[]) v);
        }
        return String.valueOf(v);
    }

    static void dump(String label, Attributes attrs) throws NamingException {
        NamingEnumeration<? extends Attribute> all = attrs.getAll();
        while (all.hasMore()) {
            Attribute a = all.next();
            NamingEnumeration<?> values = a.getAll();
            while (values.hasMore()) {
                say("attr", label, a.getID(), text(values.next()));
            }
        }
    }

    static void show(LdapContext ctx, String label, String dn) throws Exception {
        step("read " + label, () -> dump(label, ctx.getAttributes(dn,
            new String[] {"uid", "cn", "sn", "mail", "description", "telephoneNumber"})));
    }

    // ------------------------------------------------------------ scenarios

    static void rootDse(LdapContext ctx) throws NamingException {
        dump("", ctx.getAttributes("", new String[] {
            "namingContexts", "supportedControl", "supportedExtension", "supportedLDAPVersion",
            "subschemaSubentry"}));
    }

    static void search(LdapContext ctx, String base, String filter, String attrs, int limit)
            throws NamingException {
        SearchControls sc = new SearchControls();
        sc.setSearchScope(SearchControls.SUBTREE_SCOPE);
        sc.setReturningAttributes(attrs.equals("*") ? null : attrs.split(","));
        sc.setCountLimit(limit);
        NamingEnumeration<SearchResult> results = ctx.search(base, filter, sc);
        try {
            while (results.hasMore()) {
                SearchResult r = results.next();
                String dn = r.getNameInNamespace();
                say("entry", dn);
                dump(dn, r.getAttributes());
            }
        } finally {
            results.close();
        }
    }

    static void compare(LdapContext ctx, String dn, String filter) throws NamingException {
        SearchControls sc = new SearchControls();
        sc.setSearchScope(SearchControls.OBJECT_SCOPE);
        sc.setReturningAttributes(new String[0]);
        NamingEnumeration<SearchResult> results = ctx.search(dn, filter, sc);
        say("compare", results.hasMore() ? "true" : "false");
        results.close();
    }

    static ModificationItem mod(int op, String attr, String... values) {
        BasicAttribute a = new BasicAttribute(attr);
        for (String v : values) a.add(v);
        return new ModificationItem(op, a);
    }

    static void modify(LdapContext ctx, String dn) throws Exception {
        step("add values", () -> ctx.modifyAttributes(dn, new ModificationItem[] {
            mod(DirContext.ADD_ATTRIBUTE, "description", "jndi one", "jndi two")}));
        show(ctx, "after add", dn);
        step("replace", () -> ctx.modifyAttributes(dn, new ModificationItem[] {
            mod(DirContext.REPLACE_ATTRIBUTE, "telephoneNumber", "+1 555 0199", "+1 555 0198")}));
        show(ctx, "after replace", dn);
        step("remove value", () -> ctx.modifyAttributes(dn, new ModificationItem[] {
            mod(DirContext.REMOVE_ATTRIBUTE, "description", "jndi one")}));
        show(ctx, "after remove value", dn);
        // No values: the whole attribute goes.
        step("remove attribute", () -> ctx.modifyAttributes(dn, DirContext.REMOVE_ATTRIBUTE,
            new BasicAttributes("mail", null, true)));
        show(ctx, "after remove attribute", dn);
        step("add existing value", () -> ctx.modifyAttributes(dn, new ModificationItem[] {
            mod(DirContext.ADD_ATTRIBUTE, "description", "jndi two")}));
        step("remove absent value", () -> ctx.modifyAttributes(dn, new ModificationItem[] {
            mod(DirContext.REMOVE_ATTRIBUTE, "description", "never there")}));
        // One request, the second change fails: nothing of it applies.
        step("half failing", () -> ctx.modifyAttributes(dn, new ModificationItem[] {
            mod(DirContext.REPLACE_ATTRIBUTE, "sn", "Changed"),
            mod(DirContext.ADD_ATTRIBUTE, "description", "jndi two")}));
        show(ctx, "after half failing", dn);
        step("undefined attribute", () -> ctx.modifyAttributes(dn, new ModificationItem[] {
            mod(DirContext.ADD_ATTRIBUTE, "noSuchAttributeType", "x")}));
        step("missing entry", () -> ctx.modifyAttributes("uid=nobody," + dn.substring(dn.indexOf(',') + 1),
            new ModificationItem[] {mod(DirContext.REPLACE_ATTRIBUTE, "description", "x")}));
    }

    static Attributes person(String uid, boolean withSn) {
        Attributes a = new BasicAttributes(true);
        BasicAttribute oc = new BasicAttribute("objectClass");
        for (String c : new String[] {"top", "person", "organizationalPerson", "inetOrgPerson"}) oc.add(c);
        a.put(oc);
        a.put("uid", uid);
        a.put("cn", "Zoë Jndi " + uid);
        if (withSn) a.put("sn", "Jndi");
        a.put("mail", uid + "@example.com");
        return a;
    }

    static void addDelete(LdapContext ctx, String parent) throws Exception {
        String dn = "uid=jndi-new," + parent;
        step("add", () -> ctx.createSubcontext(dn, person("jndi-new", true)).close());
        show(ctx, "added", dn);
        step("add again", () -> ctx.createSubcontext(dn, person("jndi-new", true)).close());
        step("add without sn", () -> ctx.createSubcontext("uid=jndi-bad," + parent, person("jndi-bad", false)).close());
        step("add under missing parent",
            () -> ctx.createSubcontext("uid=jndi-orphan,ou=Nowhere," + parent, person("jndi-orphan", true)).close());
        step("delete non-leaf", () -> ctx.destroySubcontext(parent));
        step("delete", () -> ctx.destroySubcontext(dn));
        step("read deleted", () -> ctx.getAttributes(dn));
    }

    static void rename(LdapContext ctx, String oldDn, String newDn, String movedDn) throws Exception {
        step("rename", () -> ctx.rename(oldDn, newDn));
        show(ctx, "renamed", newDn);
        step("read old name", () -> ctx.getAttributes(oldDn));
        step("move", () -> ctx.rename(newDn, movedDn));
        show(ctx, "moved", movedDn);
        step("rename missing", () -> ctx.rename(newDn, oldDn));
    }

    static void list(LdapContext ctx, String base, String filter, String attr, int pageSize, String sort)
            throws Exception {
        SearchControls sc = new SearchControls();
        sc.setSearchScope(SearchControls.ONELEVEL_SCOPE);
        sc.setReturningAttributes(new String[] {attr});
        List<SortKey> keys = new ArrayList<>();
        if (!sort.equals("-")) {
            for (String k : sort.split(",")) {
                boolean reverse = k.startsWith("-");
                // The sort is critical: name the ordering rule, as RFC 2891
                // (and slapd) want for types without an ORDERING rule.
                keys.add(new SortKey(reverse ? k.substring(1) : k, !reverse, "caseIgnoreOrderingMatch"));
            }
        }
        byte[] cookie = null;
        int pages = 0;
        do {
            List<Control> controls = new ArrayList<>();
            if (!keys.isEmpty()) {
                controls.add(new SortControl(keys.toArray(new SortKey[0]), Control.CRITICAL));
            }
            if (pageSize > 0) {
                controls.add(new PagedResultsControl(pageSize, cookie, Control.CRITICAL));
            }
            ctx.setRequestControls(controls.toArray(new Control[0]));
            NamingEnumeration<SearchResult> results = ctx.search(base, filter, sc);
            int n = 0;
            while (results.hasMore()) {
                SearchResult r = results.next();
                List<String> line = new ArrayList<>();
                line.add("entry");
                line.add(r.getNameInNamespace());
                Attribute a = r.getAttributes().get(attr);
                if (a != null) {
                    NamingEnumeration<?> values = a.getAll();
                    while (values.hasMore()) line.add(text(values.next()));
                }
                say(line.toArray(new String[0]));
                n++;
            }
            cookie = null;
            int size = -1;
            Control[] response = ctx.getResponseControls();
            if (response != null) {
                for (Control c : response) {
                    if (c instanceof PagedResultsResponseControl) {
                        cookie = ((PagedResultsResponseControl) c).getCookie();
                        size = ((PagedResultsResponseControl) c).getResultSize();
                    } else if (c instanceof SortResponseControl) {
                        say("sort", String.valueOf(((SortResponseControl) c).getResultCode()));
                    }
                }
            }
            pages++;
            say("page", String.valueOf(pages), String.valueOf(n), String.valueOf(size));
        } while (cookie != null && cookie.length > 0 && pages < 100);
        ctx.setRequestControls(null);
    }
}
