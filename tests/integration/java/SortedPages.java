// A JNDI client (javax.naming.ldap) asking for a sorted, paged search: the
// way Java address books and admin consoles list a directory. Run as a
// single-file program: java SortedPages.java URL BIND_DN PASSWORD BASE
// FILTER SORT_ATTR PAGE_SIZE. Prints "dn: <name>" per entry in the order
// received, "page: <n>" after each page and "sort: <result code>" for the
// sort response of each page.
import java.util.Hashtable;
import javax.naming.Context;
import javax.naming.NamingEnumeration;
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

public class SortedPages {
    public static void main(String[] args) throws Exception {
        Hashtable<String, String> env = new Hashtable<>();
        env.put(Context.INITIAL_CONTEXT_FACTORY, "com.sun.jndi.ldap.LdapCtxFactory");
        env.put(Context.PROVIDER_URL, args[0]);
        env.put(Context.SECURITY_AUTHENTICATION, "simple");
        env.put(Context.SECURITY_PRINCIPAL, args[1]);
        env.put(Context.SECURITY_CREDENTIALS, args[2]);
        LdapContext ctx = new InitialLdapContext(env, null);
        int pageSize = Integer.parseInt(args[6]);
        SearchControls sc = new SearchControls();
        sc.setSearchScope(SearchControls.ONELEVEL_SCOPE);
        sc.setReturningAttributes(new String[] {args[5]});
        byte[] cookie = null;
        int pages = 0;
        do {
            ctx.setRequestControls(new Control[] {
                // Critical: the ordering rule is named (RFC 2891; uid has
                // no ORDERING rule of its own).
                new SortControl(new SortKey[] {new SortKey(args[5], true, "caseIgnoreOrderingMatch")},
                                Control.CRITICAL),
                new PagedResultsControl(pageSize, cookie, Control.CRITICAL)
            });
            NamingEnumeration<SearchResult> results = ctx.search(args[3], args[4], sc);
            while (results.hasMore()) {
                System.out.println("dn: " + results.next().getNameInNamespace());
            }
            cookie = null;
            Control[] response = ctx.getResponseControls();
            if (response != null) {
                for (Control c : response) {
                    if (c instanceof PagedResultsResponseControl) {
                        cookie = ((PagedResultsResponseControl) c).getCookie();
                    } else if (c instanceof SortResponseControl) {
                        System.out.println("sort: " + ((SortResponseControl) c).getResultCode());
                    }
                }
            }
            pages++;
            System.out.println("page: " + pages);
        } while (cookie != null && cookie.length > 0 && pages < 100);
        ctx.close();
    }
}
